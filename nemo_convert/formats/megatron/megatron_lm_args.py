"""Megatron-LM ``args`` of a hybrid (Mamba / attention / MLP / MoE) training run, read into the
NeMo config the same way a Megatron-Bridge ``HybridModelProvider`` section is.

Megatron-LM trains hybrid stacks with ``pretrain_mamba.py`` (core_v0.16.1; from core_v0.19.0 a
wrapper of ``pretrain_hybrid.py``). Its builder (core_v0.16.1 ``mamba_builders.py`` lines
11-41; core_v0.19.0 ``hybrid_builders.py`` lines 12-43) makes the ``TransformerConfig`` from the
args with ``core_transformer_config_from_args`` (the GPT runs' function, core_v0.16.1
``megatron/training/arguments.py`` lines 1306-1370) and passes the rest to ``MambaModel`` /
``HybridModel`` itself: the layer pattern (core_v0.16.1 ``hybrid_override_pattern`` with
``hybrid_attention_ratio`` / ``hybrid_mlp_ratio``; core_v0.19.0 ``hybrid_layer_pattern``),
``max_sequence_length = max_position_embeddings``, the tying, ``position_embedding_type``,
``rotary_percent`` and ``rotary_base``. That is the field set of Megatron-Bridge's
``HybridModelProvider`` (a ``TransformerConfig`` for the same model), so the run's args are
renamed into such a section (:func:`hybrid_section`) and read by
:func:`~nemo_convert.formats.megatron.provider_read.provider_to_nemo` with the provider the
installed hybrid family declares: one translation (its
:func:`~nemo_convert.formats.megatron.provider_flags.hybrid_nemo`, the family's fixed fields
refused by name, the NeMo class it declares, the family picked by its own claim).

Which run is hybrid (:func:`is_hybrid_run`): the builder needs ``--spec`` (core_v0.16.1
``mamba_builders.py`` lines 20-23: ``ValueError`` without it), and NVIDIA's recipes name
Megatron-Core's stack specs (:data:`HYBRID_SPECS`; core_v0.16.1 ``examples/mamba/train.sh``
line 101, core_v0.19.0 line 99). ``pretrain_gpt.py`` builds a GPT model whatever the hybrid
arguments say, and ``model_type`` is ``ModelType.encoder_or_decoder`` for both scripts
(core_v0.16.1 ``pretrain_mamba.py`` line 363, core_v0.19.0 ``pretrain_hybrid.py`` line 472), so
the spec decides; a hybrid marker (:data:`HYBRID_MARKERS`: ``is_hybrid_model``, a pattern,
allocation ratios) beside another spec is refused by name rather than guessed.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.formats.megatron.provider_gpt_oss import QUICK_GELU
from nemo_convert.formats.megatron.providers import (
    SILU,
    SQUARED_RELU,
    ProviderFamily,
    ProviderTable,
)

#: TransformerConfig's default MLP function (Megatron-Core 0.16.1 ``transformer_config.py``).
GELU = "torch.nn.functional.gelu"

#: Megatron-Core's own stack specs of a hybrid model, as ``--spec`` names them (module,
#: function): core_v0.16.1 ``megatron/core/models/mamba/mamba_layer_specs.py``
#: ``mamba_stack_spec``; core_v0.18.2 and core_v0.19.0 ``megatron/core/models/hybrid/
#: hybrid_layer_specs.py`` ``hybrid_stack_spec`` (their ``examples/mamba/train.sh`` line 99), which
#: also names it ``mamba_stack_spec`` (core_v0.18.2 line 308, core_v0.19.0 line 356) and which
#: core_v0.19.0's ``mamba_layer_specs.py`` re-exports whole (``import *``).
HYBRID_SPECS = (("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"),
                ("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"),
                ("megatron.core.models.hybrid.hybrid_layer_specs", "mamba_stack_spec"),
                ("megatron.core.models.mamba.mamba_layer_specs", "hybrid_stack_spec"))

#: Arguments that only a hybrid run sets to other than their default (core_v0.16.1
#: ``arguments.py`` lines 2822-2836 and ``transformer_config.py`` line 843; core_v0.19.0
#: ``arguments.py`` lines 3485-3497; ``mtp_hybrid_override_pattern``: ``transformer_config.py``
#: line 90).
HYBRID_MARKERS: dict[str, Any] = {"is_hybrid_model": False, "hybrid_override_pattern": None,
                                  "hybrid_layer_pattern": None, "hybrid_attention_ratio": 0.0,
                                  "hybrid_mlp_ratio": 0.0, "mtp_hybrid_override_pattern": None}

#: Hybrid arguments that change nothing a checkpoint holds, with the reason:
#: ``use_mamba_mem_eff_path`` picks the fused training kernel (same math);
#: ``mamba_training_ssm_states_dtype`` the dtype of the training forward's inter-chunk states;
#: ``mamba_inference_conv_states_dtype`` / ``mamba_inference_ssm_states_dtype`` the inference
#: caches (core_v0.19.0 ``transformer_config.py`` lines 1192-1199, ``arguments.py`` lines
#: 1052-1054). They are not read.
HYBRID_HARMLESS = ("use_mamba_mem_eff_path", "mamba_training_ssm_states_dtype", "mamba_inference_conv_states_dtype",
                   "mamba_inference_ssm_states_dtype")

#: core_v0.19.0's pattern separators (``models/hybrid/hybrid_layer_allocation.py`` lines 24-25):
#: ``|`` bounds pipeline stages (layout, not math), ``/`` starts the multi-token-prediction part.
PIPE, MTP_SEPARATOR = "|", "/"


def _spec(args: dict[str, Any]) -> tuple[str, ...] | None:
    spec = args.get("spec")
    if spec is None:
        return None
    return tuple(str(s) for s in spec) if isinstance(spec, (list, tuple)) else (str(spec),)


def is_hybrid_run(args: dict[str, Any], where: str) -> bool:
    """Whether ``args`` are a hybrid run's (module docstring): ``spec`` is one of
    :data:`HYBRID_SPECS`. A :data:`HYBRID_MARKERS` argument set beside another spec (or none)
    is refused by name: which model class trained is then not known."""
    spec = _spec(args)
    if spec in HYBRID_SPECS:
        if args.get("transformer_impl") == "inference_optimized":  # the builder's other spec (lines 17-19)
            raise UnsupportedError(f"{where}: transformer_impl='inference_optimized' builds the hybrid model with "
                                   "Megatron-Core's inference stack spec, whose layers are not known here")
        return True
    marked = {k: args[k] for k, neutral in HYBRID_MARKERS.items() if args.get(k) not in (None, neutral)}
    if marked:
        k, v = next(iter(marked.items()))
        raise UnsupportedError(f"{where}: {k}={v!r} marks a hybrid (Mamba) run, but spec={list(spec or ())!r} is not "
                               "Megatron-Core's Mamba / hybrid stack spec (" + "; ".join(" ".join(s) for s in HYBRID_SPECS[:2])
                               + "): its layers are not known here")
    return False


def _spread(kinds: list[str], symbol: str, step: float) -> None:
    """Turn Mamba layers of ``kinds`` into ``symbol`` every ``step`` Mamba layers, as
    Megatron-Core's allocator places them (a running budget: a Mamba layer is taken when the
    budget is below one half, which then grows by ``step``; otherwise it shrinks by one)."""
    budget = step
    for i, kind in enumerate(kinds):
        if kind != "M":
            continue
        if budget < 0.5:
            kinds[i] = symbol
            budget += step
        else:
            budget -= 1


def ratio_pattern(layers: int, attention: float, mlp: float) -> str:
    """The layer pattern Megatron-Core allocates without an override pattern (core_v0.16.1
    ``ssm/mamba_hybrid_layer_allocation.py`` ``_allocate_auto``, lines 35-69; the same in
    core_v0.19.0 ``models/hybrid/hybrid_layer_allocation.py`` ``pattern_from_ratios``): round(L ×
    attention) attention layers spread over the Mamba layers in ``count + 1`` sections, then
    round(L × mlp) MLP layers among the Mamba layers left. Python's ``round`` and float steps,
    as there (deterministic)."""
    if layers < 1 or not (0.0 <= attention <= 1.0 and 0.0 <= mlp <= 1.0 and attention + mlp <= 1.0):
        raise UnsupportedError(f"hybrid_attention_ratio={attention}, hybrid_mlp_ratio={mlp} over {layers} layers: "
                               "Megatron-Core's allocator asserts ratios in [0, 1] summing to at most 1")
    kinds = ["M"] * layers
    attn = round(layers * attention)
    mamba = layers - attn
    _spread(kinds, "*", mamba / (attn + 1))
    mlps = round(layers * mlp)
    if mlps > 0:
        _spread(kinds, "-", (mamba - mlps) / mlps)
    return "".join(kinds)


def _counts(pattern: str) -> dict[str, int]:
    return {s: pattern.count(s) for s in sorted(set(pattern))}


def run_pattern(args: dict[str, Any], where: str) -> str:
    """The run's layer pattern: ``hybrid_layer_pattern`` (core_v0.19.0; its ``validate_args``
    copies the deprecated ``hybrid_override_pattern`` into it, ``arguments.py`` lines 719-731)
    or ``hybrid_override_pattern`` (core_v0.16.1), pipeline-stage bars removed; without one,
    the ratios' allocation (:func:`ratio_pattern`). An override pattern with ratios must
    allocate as many layers of each kind (``allocate_layers`` raises otherwise, line 116).
    A multi-token-prediction part (``/``, or ``mtp_hybrid_override_pattern``) is refused."""
    new, old = args.get("hybrid_layer_pattern"), args.get("hybrid_override_pattern")
    if new is not None and old is not None and new != old:
        raise UnsupportedError(f"{where}: hybrid_layer_pattern={new!r} and hybrid_override_pattern={old!r} differ")
    pattern = new if new is not None else old
    layers = int(args["num_layers"])
    attention = float(args.get("hybrid_attention_ratio") or 0.0)
    mlp = float(args.get("hybrid_mlp_ratio") or 0.0)
    if args.get("mtp_hybrid_override_pattern") is not None or (isinstance(pattern, str) and MTP_SEPARATOR in pattern):
        raise UnsupportedError(f"{where}: a multi-token-prediction pattern (hybrid_layer_pattern={pattern!r}, "
                               f"mtp_hybrid_override_pattern={args.get('mtp_hybrid_override_pattern')!r}): Megatron-Core "
                               "0.16.1's MambaModel has no multi-token-prediction block")
    if pattern is None:
        return ratio_pattern(layers, attention, mlp)
    if not isinstance(pattern, str):
        raise ConfigError(f"{where}: hybrid_layer_pattern={pattern!r} is not a string")
    pattern = pattern.replace(PIPE, "")
    if (attention > 0.0 or mlp > 0.0) and len(pattern) == layers:
        auto = ratio_pattern(layers, attention, mlp)
        if _counts(auto) != _counts(pattern):
            raise UnsupportedError(f"{where}: hybrid_override_pattern={pattern!r} has other layer counts than the "
                                   f"ratios' allocation {auto!r} (Megatron-Core refuses to build that model)")
    return pattern


def hybrid_family_provider(providers: ProviderTable, where: str) -> ProviderFamily:
    """The one provider declaration of an installed hybrid family (:attr:`ProviderFamily.hybrid`)."""
    mine = [p for p in providers.families.values() if isinstance(p, ProviderFamily) and p.hybrid]
    if len(mine) != 1:
        raise UnsupportedError(f"{where}: a hybrid (Mamba) run, and " + (
            "no installed family declares a hybrid stack" if not mine else
            f"{len(mine)} installed families declare one ({', '.join(sorted(p.target for p in mine))})"))
    return mine[0]


#: What a Megatron-LM run's MLP is, by its activation switches (core_v0.16.1
#: ``megatron/training/arguments.py`` ``core_transformer_config_from_args`` lines 1332-1344):
#: ``--swiglu`` is gated SiLU; then ``--squared-relu`` makes it squared ReLU (ungated), else
#: ``--quick-geglu`` gated quick-GeLU (Megatron-Core's ``quick_gelu``), each asserting not
#: ``--swiglu`` (so with both, squared ReLU wins); none of them leaves TransformerConfig's
#: ``F.gelu`` (erf GeLU, made the tanh kernel by ``bias_activation_fusion``, which is
#: ``--bias-swiglu-fusion`` for ``--swiglu`` and ``--bias-gelu-fusion`` otherwise).
ACTIVATION_SWITCHES = ("swiglu", "squared_relu", "quick_geglu")


def _activation(args: dict[str, Any], where: str) -> dict[str, Any]:
    """The provider's ``activation_func`` / ``gated_linear_unit`` / ``bias_activation_fusion``
    of a run's switches (:data:`ACTIVATION_SWITCHES`, in Megatron-LM's order)."""
    swiglu = bool(args.get("swiglu"))
    other = next((k for k in ACTIVATION_SWITCHES[1:] if args.get(k)), None)
    if swiglu and other:
        raise UnsupportedError(f"{where}: swiglu and {other} are both set (Megatron-LM asserts not)")
    fn, gated = ((SQUARED_RELU, False) if other == "squared_relu" else (QUICK_GELU, True) if other else
                 (SILU, True) if swiglu else (GELU, False))
    fused = args.get("bias_swiglu_fusion", True) if swiglu else args.get("bias_gelu_fusion", True)
    return {"activation_func": fn, "gated_linear_unit": gated, "bias_activation_fusion": bool(fused)}


def run_section(args: dict[str, Any], where: str, target: str) -> dict[str, Any]:
    """A Megatron-LM run's args renamed into a ``target`` provider section: the fields
    ``core_transformer_config_from_args`` derives (core_v0.16.1 ``arguments.py`` lines
    1306-1370: every ``TransformerConfig`` field under its own name; the MLP of
    :data:`ACTIVATION_SWITCHES`; ``num_query_groups`` only with ``group_query_attention``,
    lines 1348-1351; ``num_experts`` as ``num_moe_experts``, line 1327; up to core_v0.15.3,
    ``layernorm_zero_centered_gamma = args.apply_layernorm_1p``, its ``arguments.py`` line 1249 —
    from core_v0.16.1 the flag is TransformerConfig's own ``--layernorm-zero-centered-gamma``)
    and what the model builder passes (core_v0.16.1 ``gpt_builders.py`` lines 99-108:
    ``max_sequence_length = max_position_embeddings``, the tying, ``position_embedding_type``,
    ``rotary_percent``, ``rotary_base``, ``rope_scaling = use_rope_scaling``); the rest under
    their own names, the harmless ones (:data:`HYBRID_HARMLESS`) dropped. ``--openai-gelu`` is
    read by Megatron-LM's legacy models only (core_v0.16.1 ``megatron/legacy/model/
    transformer.py`` lines 132-133; neither ``core_transformer_config_from_args`` nor
    Megatron-Core reads it): in a Megatron-Core run (``use_legacy_models`` false) it changes
    nothing and is dropped; a legacy run keeps it, to be refused by name."""
    section = {k: v for k, v in args.items() if k not in HYBRID_HARMLESS and k not in HYBRID_MARKERS
               and k not in ACTIVATION_SWITCHES and k != "spec"}
    if section.get("layernorm_epsilon") is None and args.get("norm_epsilon") is not None:
        section["layernorm_epsilon"] = args["norm_epsilon"]  # older Megatron-LM spelling
    if section.pop("apply_layernorm_1p", False):
        section["layernorm_zero_centered_gamma"] = True
    if not args.get("use_legacy_models"):
        section.pop("openai_gelu", None)
    heads = int(args["num_attention_heads"])
    section.update({
        "_target_": target, **_activation(args, where),
        "num_query_groups": int(args.get("num_query_groups") or heads) if args.get("group_query_attention") else heads,
        "num_moe_experts": section.pop("num_experts", None),
        "seq_length": args.get("max_position_embeddings"),
        "seq_len_interpolation_factor": section.pop("rotary_seq_len_interpolation_factor", None),
        "share_embeddings_and_output_weights": not bool(args.get("untie_embeddings_and_output_weights", False)),
        "rope_scaling": bool(section.pop("use_rope_scaling", False)),
    })
    return section


def hybrid_section(args: dict[str, Any], where: str, target: str) -> dict[str, Any]:
    """A hybrid run's args as a ``target`` provider section (module docstring): the run's
    section (:func:`run_section`) with the layer pattern the builder passes."""
    return {**run_section(args, where, target), "hybrid_layer_pattern": run_pattern(args, where),
            "is_hybrid_model": True}
