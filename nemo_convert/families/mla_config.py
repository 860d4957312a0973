"""Multi-latent attention's ``config.json`` keys ⇄ Megatron-Core's ``MLATransformerConfig``
fields, for any family whose HF class spells MLA the DeepSeek way.

transformers 5.24 ``models/deepseek_v2/modeling_deepseek_v2.py`` (``DeepseekV2Attention``,
lines 290–423): queries through ``q_proj`` or, with ``q_lora_rank``, ``q_a_proj`` → RMSNorm →
``q_b_proj``; ``kv_a_proj_with_mqa`` gives the ``kv_lora_rank`` latent plus one shared
``qk_rope_head_dim`` rotary key; ``kv_b_proj`` expands the latent per head into
``qk_nope_head_dim`` key and ``v_head_dim`` value channels; the softmax scale is
``(qk_nope_head_dim + qk_rope_head_dim)^-0.5`` (times YaRN's factor,
:mod:`nemo_convert.families.yarn`). ``configuration_deepseek_v2.py`` (``__post_init__``) sets
``qk_head_dim`` to that sum and ``head_dim`` to ``qk_rope_head_dim``: a config saved by v5
carries both, derived, never free.

Megatron-Core 0.16.1 ``transformer/transformer_config.py`` ``MLATransformerConfig``
(lines 2034–2059): ``q_lora_rank`` (None: one ``linear_q_proj``), ``kv_lora_rank``,
``qk_head_dim`` (the no-position part), ``qk_pos_emb_head_dim``, ``v_head_dim``; NeMo keeps
``kv_channels`` = ``v_head_dim`` beside them. MLA has one key and value per head: a
``num_key_value_heads`` other than the heads is refused by name.

An absent key means the config class's default, the same in ``DeepseekV2Config``
(``configuration_deepseek_v2.py`` lines 105–117) and ``DeepseekV3Config``
(``configuration_deepseek_v3.py`` lines 92–96): ``q_lora_rank`` 1536 (only an explicit null
means no query LoRA), ``kv_lora_rank`` 512, ``qk_nope_head_dim`` 128, ``qk_rope_head_dim`` 64,
``v_head_dim`` 128.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.errors import ConfigError
from nemo_convert.families.config_table import Check, Derived
from nemo_convert.spec import spec_of

#: HF MLA key → Megatron-Core MLA field (the four sizes; ``q_lora_rank`` may be null).
MLA_SIZES = {"kv_lora_rank": "kv_lora_rank", "qk_nope_head_dim": "qk_head_dim",
             "qk_rope_head_dim": "qk_pos_emb_head_dim", "v_head_dim": "v_head_dim"}
#: What an absent key means (module docstring).
MLA_DEFAULTS = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                "v_head_dim": 128}


def _size(hf: dict[str, Any], key: str) -> Any:
    return hf[key] if key in hf else MLA_DEFAULTS[key]


def _sizes_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {nemo: int(_size(hf, key)) for key, nemo in MLA_SIZES.items()}
    q = _size(hf, "q_lora_rank")
    out["q_lora_rank"] = int(q) if q else None
    out["kv_channels"] = out["v_head_dim"]
    return out


def _sizes_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    mla = spec_of(cfg).attention.mla
    sizes = None if mla is None else {key: getattr(mla, nemo) for key, nemo in MLA_SIZES.items()}
    if sizes is None or any(v is None for v in sizes.values()):
        raise ConfigError("the NeMo config is not multi-latent attention with all of its sizes "
                          f"({', '.join(MLA_SIZES.values())})")
    nope, pos = int(sizes["qk_nope_head_dim"]), int(sizes["qk_rope_head_dim"])
    return {"q_lora_rank": mla.q_lora_rank if mla else None, **sizes, "head_dim": pos, "qk_head_dim": nope + pos}


def _derived_sizes(hf: dict[str, Any]) -> str | None:
    """``head_dim`` / ``qk_head_dim`` as transformers derives them, and one key/value per head."""
    pos = int(_size(hf, "qk_rope_head_dim"))
    whole = int(_size(hf, "qk_nope_head_dim")) + pos
    for key, want in (("head_dim", pos), ("qk_head_dim", whole)):
        if hf.get(key) is not None and int(hf[key]) != want:
            return f"{key}={hf[key]} (multi-latent attention derives {want} from qk_nope_head_dim and qk_rope_head_dim)"
    heads = int(hf["num_attention_heads"])
    kv = hf.get("num_key_value_heads")
    if kv is not None and int(kv) != heads:
        return f"num_key_value_heads={kv} (multi-latent attention has one key and value per head: {heads})"
    return None


#: The rows an MLA family adds to ``GPT_CONFIG`` (extend with ``drop=("head_dim",)``: MLA's
#: ``head_dim`` is the rotary part, checked here, not the attention's head size).
MLA_ROWS = (
    Derived(("q_lora_rank", *MLA_SIZES), _sizes_to_nemo, _sizes_to_hf),
    Check(("head_dim", "qk_head_dim"), _derived_sizes),
)
