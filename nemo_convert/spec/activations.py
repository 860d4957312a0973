"""MLP activations: NeMo's names and Megatron-Core's functions, read as what they compute.

The canonical functions are ``silu``, ``gelu`` (erf), ``gelu_tanh`` (the tanh
approximation), ``relu``, ``squared_relu`` and ``quick_gelu`` (``x·σ(1.702x)``); an MLP is
that function, gated or not.

NeMo 1 (NeMo ``8cfedd72``): gated when the ``activation`` name ends in ``glu``
(``megatron_base_model.py`` line 514); the function from ``activation_to_func``
(``nemo/collections/nlp/parts/utils_funcs.py`` lines 170-215), where ``openai_gelu`` takes
precedence over every activation (tanh GeLU); a GeLU with ``bias_activation_fusion``
(NeMo's default: ``megatron_base_model.py`` line 550) runs Megatron-Core's fused
``bias_gelu`` / ``bias_geglu`` kernels (``mlp.py`` forward, ``fusions/fused_bias_gelu.py``
line 19, ``fused_bias_geglu.py`` line 27), which compute the **tanh approximation**.

Megatron-Core 0.16.1 / Megatron-Bridge / NeMo 2 name the function itself
(``activation_func``: ``torch.nn.functional.silu``, ``megatron.core.activations.fast_gelu``,
…) beside ``gated_linear_unit``; Megatron-Core's ``bias_activation_fusion`` defaults to
False (``transformer_config.py``), and under it ``F.gelu`` is the fused tanh kernel too.
"""

from __future__ import annotations

from typing import Any, Mapping

#: NeMo ``activation`` → (gated, function) before ``openai_gelu`` and the fused kernels.
#: NeMo 1's names (``activation_to_func``), Megatron-Bridge's non-gated ``silu`` / ``relu``
#: (read from provider directories) and GPT-OSS's ``quick-geglu`` (``x·σ(1.702x)``).
NEMO_ACTIVATIONS: dict[str, tuple[bool, str]] = {
    "gelu": (False, "gelu"), "geglu": (True, "gelu"), "fast-geglu": (True, "gelu"),
    "swiglu": (True, "silu"), "fast-swiglu": (True, "silu"), "silu": (False, "silu"),
    "reglu": (True, "relu"), "fast-reglu": (True, "relu"), "relu": (False, "relu"),
    "squared-relu": (False, "squared_relu"), "approx-gelu": (False, "quick_gelu"),
    "quick-geglu": (True, "quick_gelu"),
}

#: How each function is named in messages.
FUNCTION_NAMES: dict[str, str] = {
    "silu": "SiLU", "gelu": "GeLU (erf)", "gelu_tanh": "GeLU (tanh approximation)", "relu": "ReLU",
    "squared_relu": "squared ReLU", "quick_gelu": "quick GeLU x·σ(1.702x)",
}

#: Megatron-Core's function names (the last part of ``activation_func``'s ``_target_``) →
#: the function: ``torch.nn.functional`` and ``megatron.core.activations`` alike, NeMo 2's
#: ``nemo.collections.llm.fn.activation`` (``openai_gelu``, ``gelu_impl``: tanh GeLU).
MCORE_FUNCTIONS: dict[str, str] = {
    "silu": "silu", "gelu": "gelu", "fast_gelu": "gelu_tanh", "openai_gelu": "gelu_tanh", "gelu_impl": "gelu_tanh",
    "relu": "relu", "squared_relu": "squared_relu", "quick_gelu": "quick_gelu",
}


#: (gated, function) → the NeMo 1 fields that make NeMo compute it: NeMo's names, the tanh
#: GeLU through ``openai_gelu``, the erf GeLU without the fused kernel. A gated squared ReLU
#: has no NeMo 1 name.
NEMO_ACTIVATION_FIELDS: dict[tuple[bool, str], dict[str, Any]] = {
    (True, "silu"): {"activation": "fast-swiglu"}, (False, "silu"): {"activation": "silu"},
    (True, "gelu"): {"activation": "fast-geglu", "bias_activation_fusion": False},
    (False, "gelu"): {"activation": "gelu", "bias_activation_fusion": False},
    (True, "gelu_tanh"): {"activation": "geglu", "openai_gelu": True},
    (False, "gelu_tanh"): {"activation": "gelu", "openai_gelu": True},
    (True, "relu"): {"activation": "fast-reglu"}, (False, "relu"): {"activation": "relu"},
    (False, "squared_relu"): {"activation": "squared-relu"},
    (True, "quick_gelu"): {"activation": "quick-geglu"}, (False, "quick_gelu"): {"activation": "approx-gelu"},
}


def nemo_activation(cfg: Mapping[str, Any]) -> tuple[bool, str]:
    """(gated, function) of the MLP that NeMo / Megatron-Core run for a NeMo config
    (module docstring; NeMo's defaults: ``gelu``, fused)."""
    name = str(cfg.get("activation") or "gelu")
    gated, fn = NEMO_ACTIVATIONS.get(name, (name.endswith("glu"), f"unknown activation {name!r}"))
    if cfg.get("openai_gelu"):
        fn = "gelu_tanh"
    elif fn == "gelu" and cfg.get("bias_activation_fusion", True):
        fn = "gelu_tanh"
    return gated, fn


def mcore_activation(function: str, gated: bool, *, fused: bool = False) -> tuple[bool, str] | None:
    """(gated, function) of a Megatron-Core ``activation_func`` name (None: not one of
    :data:`MCORE_FUNCTIONS`); ``fused``: ``bias_activation_fusion``, which makes ``gelu``
    the tanh kernel."""
    fn = MCORE_FUNCTIONS.get(function)
    if fn is None:
        return None
    if fn == "gelu" and fused:
        fn = "gelu_tanh"
    return gated, fn


def describe_activation(act: tuple[bool, str]) -> str:
    """``gated SiLU``, ``GeLU (tanh approximation)``, … for messages."""
    gated, fn = act
    return f"{'gated ' if gated else ''}{FUNCTION_NAMES.get(fn, fn)}"
