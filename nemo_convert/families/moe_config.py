"""The mixture-of-experts and multi-token-prediction rows of the GPT decoder's config
translation: the NeMo constants every MoE family writes, the expert count and layer
pattern, the router switches, DeepSeek-style dense-first experts with groups, and
``num_nextn_predict_layers``. The dense rows are :mod:`nemo_convert.families.gpt_config`.
"""

from __future__ import annotations

from typing import Any, Mapping

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.families.config_table import Derived, Field, Row
from nemo_convert.spec import provenance_of, spec_of

# -- mixture of experts: config ------------------------------------------------------------

#: NeMo fields every MoE family writes with a fixed value (what Megatron-Core runs the HF
#: routing with: softmax scores, no grouped GEMM needed to read the weights).
MOE_NEMO_CONSTANTS: dict[str, Any] = {
    "moe_router_score_function": "softmax",
    "moe_router_load_balancing_type": "aux_loss",
    "moe_token_dispatcher_type": "alltoall",
    "moe_grouped_gemm": False,
    "expert_model_parallel_size": 1,
}


def num_experts(*keys: str) -> Derived:
    """The expert count, spelled ``num_local_experts`` (Mixtral; Qwen3-MoE in
    transformers v5) or ``num_experts`` (Qwen2/3-MoE in v4) ⇄ ``num_moe_experts``; a
    synthesised config uses the first spelling."""

    def to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
        value = next((hf[k] for k in keys if hf.get(k) is not None), None)
        if value is None:
            raise ConfigError(f"config.json lacks required field(s): {' or '.join(keys)}")
        if int(value) < 1:
            raise UnsupportedError(f"{keys[0]}={value} (a mixture-of-experts family needs experts)")
        return {"num_moe_experts": int(value)}

    def to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
        moe = spec_of(cfg).moe
        if moe is None:
            raise ConfigError("the NeMo config has no num_moe_experts (a mixture-of-experts family needs experts)")
        return {keys[0]: moe.experts}

    return Derived(keys, to_nemo, to_hf)


def moe_layers(sparse_step: str = "decoder_sparse_step", dense_layers: str = "mlp_only_layers") -> Derived:
    """Which layers are MoE (Qwen2/3-MoE: layer i is, unless it is in ``mlp_only_layers``,
    when ``(i + 1) % decoder_sparse_step == 0``) ⇄ Megatron's ``moe_layer_freq``: 1 when
    every layer is, else the per-layer list (a mixed stack)."""

    def to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
        layers = int(hf["num_hidden_layers"])
        step = int(hf.get(sparse_step) or 1)
        dense = {int(i) for i in hf.get(dense_layers) or ()}
        pattern = [int(i not in dense and (i + 1) % step == 0) for i in range(layers)]
        return {"moe_layer_freq": 1 if all(pattern) else pattern}

    def to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
        spec = spec_of(cfg)
        pattern = spec.moe.layer_pattern if spec.moe else (True,) * spec.geometry.layers
        return {sparse_step: 1, dense_layers: [i for i, on in enumerate(pattern) if not on]}

    return Derived((sparse_step, dense_layers), to_nemo, to_hf)


def _negate(v: Any) -> bool:
    return not bool(v)


#: ``norm_topk_prob`` (renormalise the top-k softmax probabilities) ⇄ Megatron's
#: ``moe_router_pre_softmax`` = its negation: top-k of the logits then softmax over k (=
#: softmax, top-k, renormalise) or softmax over all experts then top-k.
NORM_TOPK_PROB = Field("norm_topk_prob", "moe_router_pre_softmax", False, to_nemo=_negate, to_hf=_negate)

#: The rows every MoE family shares: top-k, the auxiliary loss and the router jitter
#: (training-only in both), the ``output_router_logits`` switch (harmless).
MOE_ROWS: tuple[Row, ...] = (
    Field("num_experts_per_tok", "moe_router_topk", to_nemo=int, to_hf=int),
    Field("router_aux_loss_coef", "moe_aux_loss_coeff", 0.001, to_nemo=float, to_hf=float),
    Field("router_jitter_noise", "moe_input_jitter_eps", 0.0, to_nemo=lambda v: float(v) or None, to_hf=float),
)
MOE_HARMLESS = ("output_router_logits",)


def _ffn_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    return {"ffn_hidden_size": int(hf["intermediate_size"]), "moe_ffn_hidden_size": int(hf["intermediate_size"])}


def _ffn_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    spec = spec_of(cfg)
    ffn = spec.moe.ffn if spec.moe else spec.geometry.ffn
    if ffn is None:
        raise ConfigError("the NeMo config lacks ffn_hidden_size")
    return {"intermediate_size": ffn}


#: ``intermediate_size`` as the experts' ffn (Mixtral, GPT-OSS: every layer MoE) ⇄
#: ``moe_ffn_hidden_size`` and ``ffn_hidden_size`` alike (what NeMo's converters write).
EXPERTS_FFN = Derived(("intermediate_size",), _ffn_to_nemo, _ffn_to_hf)


#: The keys :func:`dense_first_experts` reads; the last two only with ``groups=True``.
DENSE_FIRST_KEYS = ("n_routed_experts", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace",
                    "n_group", "topk_group")


def top_two_groups(topk: int, keep: int, topk_name: str, keep_name: str) -> None:
    """Refuse group-limited routing that Megatron-Core scores otherwise than an HF class that
    scores a group by the sum of its two best experts (transformers 5.24
    ``modeling_deepseek_v3.py`` lines 137-141, ``modeling_glm4_moe.py`` lines 287-291,
    ``modeling_nemotron_h.py`` lines 872-876: ``.topk(2)``); Megatron-Core 0.16.1 sums the
    best ``topk // group_topk`` (``transformer/moe/moe_utils.py`` lines 552-555). Call it only
    for more than one group (one group is every expert either way)."""
    if keep < 1 or topk // keep != 2:
        raise UnsupportedError(f"{topk_name}={topk} with {keep_name}={keep}: the HF class scores a group by the sum of "
                               f"its top 2 experts, Megatron-Core by the sum of its top {topk // max(keep, 1)} "
                               f"(moe_utils.py group_limited_topk); they agree only when {topk_name} // {keep_name} is 2")


def dense_first_experts(defaults: Mapping[str, Any], *, groups: bool = True) -> Derived:
    """Routed experts after ``first_k_dense_replace`` dense layers, with
    ``n_shared_experts`` always-on experts and (``groups``) group-limited routing, as
    DeepSeek-style configs spell them: ``n_routed_experts``, ``moe_intermediate_size`` (one
    routed expert; the shared MLP is ``n_shared_experts`` times it), ``first_k_dense_replace``
    (layer ``i`` is MoE from ``i = k`` on), ``n_group`` / ``topk_group`` ⇄
    ``num_moe_experts``, ``moe_ffn_hidden_size``, ``moe_shared_expert_intermediate_size``,
    ``moe_layer_freq`` (the per-layer list when ``k > 0``, else 1),
    ``moe_router_num_groups`` / ``moe_router_group_topk`` (None for one group).

    ``defaults``: the HF config class's default for each of these keys — what a
    ``config.json`` without the key means (the classes differ: DeepSeek-V2 64 experts and no
    dense layer, DeepSeek-V3 256 experts in 8 groups after 3 dense layers, GLM-4.5 128 after
    one). An explicit null means none: no dense layer, no shared expert, one group.

    ``groups=True`` (DeepSeek-V3, GLM-4.5): the class always routes within the best
    ``topk_group`` of ``n_group`` groups, a group scored by the sum of its two best experts;
    Megatron-Core sums the best ``topk // group_topk``, so more than one group with
    ``num_experts_per_tok // topk_group`` other than 2 is refused by name, each way
    (``defaults`` then also holds ``num_experts_per_tok``). ``groups=False`` leaves
    ``n_group`` / ``topk_group`` to the family's own row, for a class whose groups mean
    something else (DeepSeek-V2 reads them only under ``topk_method:
    group_limited_greedy`` and scores a group by its largest expert).

    Megatron-Core's MTP layer is the last decoder layer's kind (``get_gpt_mtp_block_spec``),
    the HF MTP layer is MoE (its index is past ``k``): an MTP layer over an all-dense stack is
    refused by name (``--drop-mtp`` leaves it out). A NeMo config with a dense layer after
    an MoE one, or a shared MLP that is not a whole number of experts, has no such config and
    is refused on export."""
    keys = DENSE_FIRST_KEYS if groups else DENSE_FIRST_KEYS[:4]
    missing = [k for k in ((*keys, "num_experts_per_tok") if groups else keys) if k not in defaults]
    if missing:
        raise TypeError(f"dense_first_experts: no class default for {', '.join(missing)}")

    def get(hf: dict[str, Any], key: str, none: int | None = None) -> int:
        value = hf[key] if key in hf else defaults[key]
        if value is None:
            if none is None:
                raise ConfigError(f"config.json {key}=None: must be a number")
            return none
        return int(value)

    def to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
        experts, ffn, layers = get(hf, "n_routed_experts"), get(hf, "moe_intermediate_size"), int(hf["num_hidden_layers"])
        dense, shared = get(hf, "first_k_dense_replace", 0), get(hf, "n_shared_experts", 0)
        if experts < 1 or not 0 <= dense <= layers:
            raise UnsupportedError(f"n_routed_experts={experts} / first_k_dense_replace={dense} with {layers} layers")
        mtp = int(hf.get("num_nextn_predict_layers") or 0)
        if mtp and dense == layers:
            raise UnsupportedError(f"num_nextn_predict_layers={mtp} with first_k_dense_replace={dense}: the HF MTP "
                                   "layer would be MoE, Megatron-Core's a copy of the last (dense) layer (use "
                                   "--drop-mtp)")
        out: dict[str, Any] = {"num_moe_experts": experts, "moe_ffn_hidden_size": ffn,
                               "moe_shared_expert_intermediate_size": ffn * shared or None,
                               "moe_layer_freq": [int(i >= dense) for i in range(layers)] if dense else 1}
        if groups:
            n, keep = get(hf, "n_group", 1), get(hf, "topk_group", 1)
            if n > 1:
                top_two_groups(get(hf, "num_experts_per_tok"), keep, "num_experts_per_tok", "topk_group")
            out.update(moe_router_num_groups=n if n > 1 else None, moe_router_group_topk=keep if n > 1 else None)
        return out

    def to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
        moe = spec_of(cfg).moe
        if moe is None:
            raise ConfigError("the NeMo config has no num_moe_experts (this family routes experts)")
        pattern = moe.layer_pattern
        dense = next((i for i, on in enumerate(pattern) if on), len(pattern))
        if not all(pattern[dense:]):
            raise UnsupportedError(f"moe_layer_freq={cfg.get('moe_layer_freq')!r}: a dense layer after an MoE one "
                                   "(the HF class makes every layer from first_k_dense_replace on MoE)")
        if moe.shared_ffn % moe.ffn:
            raise UnsupportedError(f"moe_shared_expert_intermediate_size={moe.shared_ffn} is not a multiple of "
                                   f"moe_ffn_hidden_size={moe.ffn} (n_shared_experts counts whole experts)")
        out = {"n_routed_experts": moe.experts, "moe_intermediate_size": moe.ffn,
               "n_shared_experts": moe.shared_ffn // moe.ffn, "first_k_dense_replace": dense}
        if groups:
            if moe.groups > 1:
                top_two_groups(moe.topk, moe.group_topk or 1, "moe_router_topk", "moe_router_group_topk")
            out.update(n_group=moe.groups, topk_group=moe.group_topk or 1)
        return out

    return Derived(keys, to_nemo, to_hf)


# -- multi-token prediction ---------------------------------------------------------------

#: Where import records MTP layers that the source's config announces but that the
#: ``.nemo`` leaves out: ``{"dropped": k}`` (``--drop-mtp``) or ``{"absent": k}`` (the
#: source does not store them: transformers announces one MTP layer and never saves it).
HF_MTP = "nemo_convert.hf_mtp"
#: Recorded ``False`` when the source's MTP layers store no copies of the embedding and
#: the head (``model.layers.{L+k}.embed_tokens`` / ``shared_head.head``: GLM-4.6's files),
#: so that export writes none either; absent: they do (DeepSeek-V3's, GLM-4.5's).
HF_MTP_COPIES = "nemo_convert.hf_mtp_copies"


def _mtp_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
    return {"mtp_num_layers": int(hf.get("num_nextn_predict_layers") or 0) or None}


def _mtp_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"num_nextn_predict_layers": spec_of(cfg).mtp_layers or provenance_of(cfg).mtp_absent}


#: ``num_nextn_predict_layers`` ⇄ Megatron-Core's ``mtp_num_layers`` (None: no MTP block).
#: Export writes the count of MTP layers it writes — none after ``--drop-mtp`` — or, for a
#: source that announced layers it did not store, the announced count again.
MTP_LAYERS = Derived(("num_nextn_predict_layers",), _mtp_to_nemo, _mtp_to_hf, restore=True)
