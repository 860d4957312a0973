"""The config rows of a hybrid stack (:mod:`nemo_convert.families.hybrid`): the per-layer
pattern and the Mamba-2 mixer's sizes, with what Megatron-Core's mixer fixes checked.

Megatron-Core 0.16.1 reads the mixer's sizes from ``TransformerConfig``
(``mamba_state_dim``, ``mamba_head_dim``, ``mamba_num_groups``, ``mamba_num_heads``:
``transformer/transformer_config.py`` lines 846–857; ``ssm/mamba_mixer.py`` lines 224–236)
and fixes the rest in ``MambaMixer.__init__`` (lines 144–172, 264–265, 314–315, 353–362),
which ``MambaLayer`` calls with the config alone (``ssm/mamba_layer.py`` lines 77–84): a
convolution of width 4 with a bias, SiLU, no bias on ``in_proj`` / ``out_proj``, ``D``
one per head, the gated RMSNorm after the gate (``norm_before_gate=False``) over groups of
``d_inner / groups`` channels with ε = 1e-5, and no limit on ``dt`` (``mamba_chunk_scan_combined``
is called without ``dt_limit``, lines 850–868: the kernel's default ``(0, inf)``).
"""

from __future__ import annotations

import math
from typing import Any

from nemo_convert.errors import ConfigError
from nemo_convert.families.config_table import Check, Derived, Field, positive_int
from nemo_convert.families.hybrid import PATTERN, SYMBOLS, mamba_dims
from nemo_convert.spec import provenance_of

#: transformers 5's list spelling of the pattern (``configuration_nemotron_h.py`` lines
#: 271–281: ``M`` ⇄ ``linear_attention``, ``*`` ⇄ ``full_attention``, ``-`` ⇄ ``mlp``,
#: ``E`` ⇄ ``moe``) and the older names it still reads (``remap_legacy_layer_types``:
#: ``mamba``, ``attention``).
BLOCK_TYPES = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E",
               "mamba": "M", "attention": "*"}
_TYPE_OF = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
PATTERN_KEYS = ("hybrid_override_pattern", "layers_block_type", "layer_types", "num_hidden_layers")


def _pattern_from_hf(hf: dict[str, Any]) -> str:
    pattern = hf.get("hybrid_override_pattern")
    listed = hf.get("layers_block_type") if hf.get("layers_block_type") is not None else hf.get("layer_types")
    if pattern is None and listed is None:
        raise ConfigError("config.json has neither hybrid_override_pattern nor layers_block_type")
    if pattern is not None and not isinstance(pattern, str):
        raise ConfigError(f"config.json hybrid_override_pattern={pattern!r} is not a string")
    if listed is not None:
        if not isinstance(listed, list) or any(t not in BLOCK_TYPES for t in listed):
            raise ConfigError(f"config.json layers_block_type={listed!r}: each entry must be one of "
                              f"{sorted(BLOCK_TYPES)}")
        from_list = "".join(BLOCK_TYPES[t] for t in listed)
        if pattern is not None and pattern != from_list:
            raise ConfigError(f"config.json hybrid_override_pattern={pattern!r} and layers_block_type={listed!r} "
                              "describe different stacks")
        pattern = from_list
    assert pattern is not None
    odd = sorted(set(pattern) - set(SYMBOLS))
    if odd or not pattern:
        raise ConfigError(f"config.json hybrid_override_pattern={pattern!r}: symbols must be {', '.join(SYMBOLS)} "
                          "(Megatron-Core's pipeline separators and MTP suffixes are not HF spellings)")
    layers = hf.get("num_hidden_layers")
    if layers is not None and int(layers) != len(pattern):
        raise ConfigError(f"config.json num_hidden_layers={layers} but the layer pattern has {len(pattern)} layers")
    return pattern


def _pattern_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    pattern = _pattern_from_hf(hf)
    return {PATTERN: pattern, "num_layers": len(pattern)}


def _pattern_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    pattern = str(cfg[PATTERN])
    source = provenance_of(cfg).hf_config or {}
    if "layers_block_type" in source:  # transformers 5's spelling, kept as the source had it
        return {"layers_block_type": [_TYPE_OF[s] for s in pattern]}
    return {"hybrid_override_pattern": pattern, "num_hidden_layers": len(pattern)}


#: The per-layer pattern, read from any spelling (``hybrid_override_pattern``, the published
#: configs'; ``layers_block_type``, what transformers 5 saves) ⇄ NeMo's ``hybrid_override_pattern``
#: and ``num_layers``; ``num_hidden_layers`` must agree with it.
HYBRID_PATTERN = Derived(PATTERN_KEYS, _pattern_to_nemo, _pattern_to_hf)


def _first(hf: dict[str, Any], keys: tuple[str, ...], default: Any) -> Any:
    for k in keys:
        if hf.get(k) is not None:
            return hf[k]
    return default


#: transformers 5's ``NemotronHConfig.__post_init__`` reads these older names of the
#: mixer's keys (``configuration_nemotron_h.py`` lines 156–166); a config may use either.
SPELLINGS = {"n_groups": ("n_groups", "mamba_n_groups"), "conv_kernel": ("conv_kernel", "mamba_d_conv"),
             "expand": ("expand", "mamba_expand"), "time_step_min": ("time_step_min", "mamba_dt_min"),
             "time_step_max": ("time_step_max", "mamba_dt_max"), "time_step_limit": ("time_step_limit", "mamba_dt_limit"),
             "time_step_floor": ("time_step_floor", "mamba_dt_init_floor"),
             "use_conv_bias": ("use_conv_bias", "mamba_conv_bias"), "chunk_size": ("chunk_size", "mamba_chunk_size")}


def _groups_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    groups = positive_int("n_groups")(_first(hf, SPELLINGS["n_groups"], 8))
    # NeMo 1's MegatronMambaModel passes mamba_ssm_ngroups to MambaModel (megatron_mamba_model.py line 70)
    return {"mamba_num_groups": groups, "mamba_ssm_ngroups": groups}


def _groups_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"n_groups": mamba_dims(cfg)[2]}


def _is_inf(v: Any) -> bool:
    if isinstance(v, dict) and set(v) == {"__float__"}:  # transformers 5's JSON spelling of a float
        v = v["__float__"]
    if isinstance(v, str):
        return v.strip().lower() in ("inf", "infinity", "+inf", "+infinity")
    return isinstance(v, (int, float)) and math.isinf(v) and v > 0


def mixer_checks(hf: dict[str, Any]) -> str | None:
    """What Megatron-Core's mixer fixes (module docstring), checked on the HF keys."""
    kernel = _first(hf, SPELLINGS["conv_kernel"], 4)
    if int(kernel) != 4:
        return f"conv_kernel={kernel} (Megatron-Core's MambaLayer builds the mixer's convolution with width 4)"
    if _first(hf, SPELLINGS["use_conv_bias"], True) is not True:
        return "use_conv_bias=False (Megatron-Core's mixer convolution always has a bias)"
    act = hf.get("mamba_hidden_act", "silu")
    if act not in ("silu", "swish"):
        return f"mamba_hidden_act={act!r} (Megatron-Core's mixer runs SiLU)"
    for key in ("use_bias", "mamba_proj_bias"):
        if hf.get(key):
            return f"{key}=True (Megatron-Core's mixer has no in_proj / out_proj bias)"
    limit = _first(hf, SPELLINGS["time_step_limit"], None)
    if limit is not None:
        lo, hi = (list(limit) + [None, None])[:2] if isinstance(limit, (list, tuple)) else (None, None)
        if not isinstance(lo, (int, float)) or float(lo) != 0.0 or not _is_inf(hi):
            return (f"time_step_limit={limit!r} (Megatron-Core's mixer clamps dt nowhere: only [0.0, Infinity] is "
                    "the same model)")
    eps = float(hf.get("layer_norm_epsilon", 1e-5))
    if eps != 1e-5:
        return (f"layer_norm_epsilon={eps} (Megatron-Core's mixer norm uses epsilon 1e-5 whatever the config, "
                "mamba_mixer.py line 357)")
    if hf.get("residual_in_fp32"):
        return "residual_in_fp32=True (Megatron-Core's MambaModel keeps residuals in the model's dtype)"
    return None


#: The Mamba-2 mixer's rows: sizes translated, fixed settings checked, initialisation-only
#: keys harmless (:data:`MIXER_HARMLESS`).
MIXER_ROWS = (
    # transformers' NemotronHConfig defaults (configuration_nemotron_h.py lines 117–121); a NeMo config
    # without the fields means Megatron-Core's defaults (hybrid.mamba_dims)
    Field("mamba_num_heads", "mamba_num_heads", 128, to_nemo=positive_int("mamba_num_heads"), to_hf=int, always=True,
          nemo_default=lambda c: mamba_dims(c)[0]),
    Field("mamba_head_dim", "mamba_head_dim", 64, to_nemo=positive_int("mamba_head_dim"), to_hf=int, always=True,
          nemo_default=lambda c: mamba_dims(c)[1]),
    Field("ssm_state_size", "mamba_state_dim", 128, to_nemo=positive_int("ssm_state_size"), to_hf=int, always=True,
          nemo_default=lambda c: mamba_dims(c)[3]),
    Derived(("n_groups", "mamba_n_groups"), _groups_to_nemo, _groups_to_hf),
    Check(("conv_kernel", "mamba_d_conv", "use_conv_bias", "mamba_conv_bias", "mamba_hidden_act", "use_bias",
           "mamba_proj_bias", "time_step_limit", "mamba_dt_limit", "residual_in_fp32"), mixer_checks),
)

#: Keys of a hybrid config that do not change the math Megatron-Core computes, and why:
#: ``time_step_min`` / ``_max`` / ``_floor`` (and their ``mamba_dt_*`` spellings) and
#: ``rescale_prenorm_residual`` only initialise weights (``mamba_mixer.py`` lines 317–331,
#: ``dt_min``/``dt_max``/``dt_init_floor``; the checkpoints' own modeling code passes
#: ``time_step_limit``, not ``time_step_min``, as the dt clamp); ``chunk_size`` is the scan's
#: blocking (Megatron-Core uses 128 whatever the config: the same sums in another order);
#: ``expand`` is unused once ``mamba_num_heads`` × ``mamba_head_dim`` is given;
#: ``mamba_ssm_cache_dtype`` and ``use_mamba_kernels`` are inference settings.
MIXER_HARMLESS = ("time_step_min", "time_step_max", "time_step_floor", "mamba_dt_min", "mamba_dt_max",
                  "mamba_dt_init_floor", "rescale_prenorm_residual", "chunk_size", "mamba_chunk_size", "expand",
                  "mamba_expand", "mamba_ssm_cache_dtype", "use_mamba_kernels")
