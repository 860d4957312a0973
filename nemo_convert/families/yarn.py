"""YaRN RoPE: Hugging Face's ``rope_type: yarn`` ⇄ Megatron-Core's YaRN fields, exactly.

Both sides compute the same three things; each HF key is mapped to the Megatron-Core field
that enters the same formula, and a combination whose math Megatron-Core computes
differently is refused by name (never converted approximately).

**transformers 5.24** (``modeling_rope_utils.py``):

* ``_compute_yarn_parameters`` (lines 346–484): ``dim = head_dim · partial_rotary_factor``;
  ``factor`` is required (``rope_parameters["factor"]``, line 418); ``beta_fast or 32``,
  ``beta_slow or 1`` (lines 444–445); the correction range of ``original_max_position_embeddings``
  floored/ceiled unless ``truncate`` is false (default true, line 475); the inverse
  frequencies blend ``1/(factor·base^(2i/dim))`` and ``1/base^(2i/dim)`` by the linear
  ramp (lines 471–483); the *attention factor* multiplying cos and sin is
  ``attention_factor`` if given, else ``mscale(factor, mscale) / mscale(factor,
  mscale_all_dim)`` when both are truthy, else ``mscale(factor)`` with ``mscale(s, m) = 0.1·m·ln s
  + 1`` (1 for s ≤ 1) (lines 430–440).
* ``standardize_rope_params`` (lines 835–843): a block without
  ``original_max_position_embeddings`` gets ``max_position_embeddings``.
* DeepSeek-V3 (``models/deepseek_v3/modeling_deepseek_v3.py``): the rotary embedding runs on
  ``head_dim`` = ``qk_rope_head_dim`` (``configuration_deepseek_v3.py`` line 123) and
  multiplies cos/sin by the attention factor (lines 66–99); the softmax scale
  ``qk_head_dim^-0.5`` is multiplied by ``mscale(factor, mscale_all_dim)²`` when
  ``mscale_all_dim`` is truthy (``yarn_apply_mscale``, lines 262–274, used at line 405).
* GPT-OSS (``models/gpt_oss/modeling_gpt_oss.py``): cos/sin times the attention factor
  (lines 157–191), the softmax scale stays ``head_dim^-0.5`` (line 269).

**Megatron-Core 0.16.1**:

* ``YarnRotaryEmbedding`` (``models/common/embeddings/yarn_rotary_pos_embedding.py``): the
  same frequencies on ``kv_channels`` (lines 80–92, 106–150), the correction range rounded
  when ``correction_range_round_to_int`` (lines 227–240), the concentration factor
  ``mscale(f, mscale) / mscale(f, mscale_all_dim)``, or ``mscale(f)`` when either is None
  (lines 252–271); it ignores ``rotary_percent`` for the frequencies.
* MLA (``transformer/multi_latent_attention.py`` lines 125–148): ``MLATransformerConfig``'s
  ``rope_type``, ``rotary_scaling_factor``, ``original_max_position_embeddings``,
  ``beta_fast``, ``beta_slow``, ``mscale``, ``mscale_all_dim`` (``transformer_config.py``
  lines 2034–2059; no ``correction_range_round_to_int``: always rounded) on
  ``qk_pos_emb_head_dim``; cos/sin times the concentration factor (lines 564, 675–683) and the
  softmax scale ``mscale(f, mscale_all_dim)² / sqrt(qk_head_dim + qk_pos_emb_head_dim)``
  (line 126) — HF's, with ``mscale_all_dim = 0`` standing for "no softmax factor".
* GPTModel (``models/gpt/gpt_model.py`` lines 172–191, ``position_embedding_type: yarn``)
  reads ``yarn_rotary_scaling_factor``, ``yarn_original_max_position_embeddings``,
  ``yarn_beta_fast``, ``yarn_beta_slow``, ``yarn_mscale``, ``yarn_mscale_all_dim``,
  ``yarn_correction_range_round_to_int`` from the config (``getattr``: fields of
  Megatron-Bridge's ``GPTModelProvider``, v0.6.0 ``gpt_provider.py`` lines 150–157); attention
  multiplies cos/sin by the concentration factor (``transformer/attention.py`` lines
  1102, 1115).

So, HF → Megatron-Core:

| HF (``rope_scaling`` / ``rope_parameters``) | MLA field | GPTModel field |
|---|---|---|
| ``rope_type``/``type: yarn`` | ``rope_type: yarn`` | ``position_embedding_type: yarn`` |
| ``factor`` (required) | ``rotary_scaling_factor`` | ``yarn_rotary_scaling_factor`` |
| ``original_max_position_embeddings`` (default ``max_position_embeddings``) | the same name | ``yarn_`` + the name |
| ``beta_fast or 32``, ``beta_slow or 1`` | ``beta_fast``, ``beta_slow`` | ``yarn_beta_fast``, ``yarn_beta_slow`` |
| ``mscale`` and ``mscale_all_dim`` both truthy | the two as given | the two as given |
| otherwise (attention factor ``mscale(factor)``) | ``mscale: 1``, ``mscale_all_dim: 0`` | both None |
| ``truncate`` (default true) | must be true (refused otherwise) | ``yarn_correction_range_round_to_int`` |
| ``attention_factor`` | only the value HF would infer (refused otherwise) | same |

Refused by name: a missing or null ``factor``; ``partial_rotary_factor`` ≠ 1 (Megatron-Core's
YaRN frequencies span the whole head); MLA with ``truncate: false``; MLA with
``mscale_all_dim`` but no ``mscale`` (transformers then scales the softmax by
``mscale(f, mscale_all_dim)²`` but cos/sin by ``mscale(f)``; Megatron-Core ties both to one
pair); an explicit ``attention_factor`` other than the inferred one; any other key in the block.
"""

from __future__ import annotations

import math
from typing import Any

from nemo_convert.errors import UnsupportedError
from nemo_convert.hf_config import Rope
from nemo_convert.spec import MLA_PLAIN as SPEC_MLA_PLAIN
from nemo_convert.spec import YarnScaling

#: HF's YaRN keys (``_validate_yarn_rope_parameters``, modeling_rope_utils.py lines 962–975,
#: plus the RoPE base and the partial factor that live beside them in v5).
YARN_HF_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                "truncate", "attention_factor", "partial_rotary_factor")

#: HF key → Megatron-Core field: MLATransformerConfig's (MLA) and GPTModel's ``yarn_*`` (GPT).
MLA_FIELDS = {"factor": "rotary_scaling_factor", "original_max_position_embeddings": "original_max_position_embeddings",
              "beta_fast": "beta_fast", "beta_slow": "beta_slow", "mscale": "mscale",
              "mscale_all_dim": "mscale_all_dim"}
GPT_FIELDS = {"factor": "yarn_rotary_scaling_factor",
              "original_max_position_embeddings": "yarn_original_max_position_embeddings",
              "beta_fast": "yarn_beta_fast", "beta_slow": "yarn_beta_slow", "mscale": "yarn_mscale",
              "mscale_all_dim": "yarn_mscale_all_dim", "truncate": "yarn_correction_range_round_to_int"}

#: What a plain-RoPE MLA config writes (:data:`nemo_convert.spec.MLA_PLAIN`, one place).
MLA_PLAIN = SPEC_MLA_PLAIN


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """``0.1 · mscale · ln(scale) + 1`` (1 when ``scale`` ≤ 1): both sides' formula."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _attention_factor(factor: float, mscale: Any, mscale_all_dim: Any) -> float:
    if mscale and mscale_all_dim:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
    return yarn_mscale(factor)


def yarn_to_nemo(rope: Rope, hf: dict[str, Any], *, mla: bool) -> dict[str, Any]:
    """The Megatron-Core fields of an HF YaRN block (module docstring), or a one-line
    :class:`UnsupportedError` naming what Megatron-Core computes differently."""
    p = rope.params
    other = sorted(set(p) - set(YARN_HF_KEYS))
    if other:
        raise UnsupportedError(f"rope scaling yarn with {', '.join(f'{k}={p[k]!r}' for k in other)}: not part of "
                               "transformers' YaRN (modeling_rope_utils.py _compute_yarn_parameters)")
    if p.get("factor") is None:
        raise UnsupportedError("rope scaling yarn without a factor")
    partial = p.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    if partial is not None and float(partial) != 1.0:
        raise UnsupportedError(f"rope scaling yarn with partial_rotary_factor={partial}: Megatron-Core's "
                               "YarnRotaryEmbedding computes its frequencies over the whole head")
    factor = float(p["factor"])
    orig = p.get("original_max_position_embeddings")
    orig = int(orig if orig is not None else hf.get("max_position_embeddings", 4096))
    mscale: Any = p.get("mscale")
    all_dim: Any = p.get("mscale_all_dim")
    truncate = p.get("truncate", True)
    inferred = _attention_factor(factor, mscale, all_dim)
    given = p.get("attention_factor")
    if given is not None and float(given) != inferred:
        raise UnsupportedError(f"rope scaling yarn with attention_factor={given}: Megatron-Core computes "
                               f"{inferred} from factor, mscale and mscale_all_dim and has no field to override it")
    both = bool(mscale) and bool(all_dim)
    common: dict[str, Any] = {"factor": factor, "original_max_position_embeddings": orig,
              "beta_fast": float(p.get("beta_fast") or 32.0), "beta_slow": float(p.get("beta_slow") or 1.0)}
    if mla:
        if not truncate:
            raise UnsupportedError("rope scaling yarn with truncate=False: Megatron-Core's multi-latent attention "
                                   "always rounds the YaRN correction range")
        if all_dim and not mscale:
            raise UnsupportedError(f"rope scaling yarn with mscale_all_dim={all_dim} and mscale={mscale!r}: "
                                   "transformers then scales cos/sin by mscale(factor) and the softmax by "
                                   "mscale(factor, mscale_all_dim)^2, which Megatron-Core's MLA cannot express")
        values: dict[str, Any] = {**common, "mscale": float(mscale) if both else 1.0,
                                  "mscale_all_dim": float(all_dim) if both else 0.0}
        return {"rope_type": "yarn", **{MLA_FIELDS[k]: v for k, v in values.items()}}
    values = {**common, "mscale": float(mscale) if both else None, "mscale_all_dim": float(all_dim) if both else None,
              "truncate": bool(truncate)}
    return {"position_embedding_type": "yarn", **{GPT_FIELDS[k]: v for k, v in values.items()}}


def yarn_to_hf(yarn: YarnScaling, *, mla: bool) -> dict[str, Any]:
    """The HF ``rope_scaling`` block of a config's YaRN (:func:`nemo_convert.spec.yarn_scaling`,
    for a config with no recorded source): the inverse of :func:`yarn_to_nemo`; a
    concentration factor HF has no spelling for is refused by name."""
    names = MLA_FIELDS if mla else GPT_FIELDS
    if yarn.factor is None:
        raise UnsupportedError(f"YaRN without {names['factor']}")
    out: dict[str, Any] = {"rope_type": "yarn", "factor": float(yarn.factor),
                           "original_max_position_embeddings": int(yarn.original_max_positions or 4096),
                           "beta_fast": float(yarn.beta_fast if yarn.beta_fast is not None else 32.0),
                           "beta_slow": float(yarn.beta_slow if yarn.beta_slow is not None else 1.0)}
    mscale, all_dim = yarn.mscale, yarn.mscale_all_dim
    if mla:
        mscale = 1.0 if mscale is None else float(mscale)
        all_dim = 0.0 if all_dim is None else float(all_dim)
    elif mscale is None or all_dim is None:  # Megatron-Core: mscale(factor), as HF without them
        mscale = all_dim = None
    if mscale is not None and all_dim is not None:
        if mscale and all_dim:
            out.update(mscale=float(mscale), mscale_all_dim=float(all_dim))
        elif not all_dim and float(mscale) == 1.0:
            pass  # mscale(f, 1) / mscale(f, 0) = mscale(f): HF's default; MLA's softmax factor is 1 either way
        else:
            raise UnsupportedError(f"YaRN with {names['mscale']}={mscale} and {names['mscale_all_dim']}={all_dim}: "
                                   "transformers has no spelling for that concentration factor")
    if not mla and not yarn.truncate:
        out["truncate"] = False
    return out
