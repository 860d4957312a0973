"""Pre-Megatron-Core NeMo GPT ``.nemo`` files (``mcore_gpt: false``), written here from NeMo's
documented tables, independently of the reader (NeMo @ 8cfedd7203):

* names: ``scripts/checkpoint_converters/convert_gpt_nemo_to_mcore.py`` ``build_key_mapping``
  (lines 117-166), read backwards; ``linear_fc1`` = ``cat(dense_h_to_4h, dense_h_to_4h_2)``
  for the separate-up spelling (lines 234-242); ``language_model.rotary_pos_emb.inv_freq`` is
  stored for RoPE models (the buffer of ``RotaryEmbedding``,
  ``modules/common/megatron/position_embedding/rotary_position_embedding.py`` lines 47-48);
  a tied model's last pipeline stage holds ``word_embeddings.weight``
  (``modules/common/megatron/module.py`` lines 142-152);
* the TP split of each tensor: ``examples/nlp/language_modeling/megatron_change_num_partitions.py``
  ``compute_tp_splits`` (lines 198-240): same shape → every rank; same first dim → along the
  last dim; fused fast-GLU ``dense_h_to_4h`` → gate and up halves chunked separately, rank i
  gets ``cat(W_i, V_i)``; else contiguous chunks of dim 0;
* ``megatron_legacy: true``: each rank's ``query_key_value`` rows are ``[q_r; k_r; v_r]``
  (the layout ``attention.py`` ``_transpose_last_dim`` regroups, lines 337-369, 431-432);
* the archive: ``model_config.yaml``, ``model_weights.ckpt`` (TP1 PP1) or
  ``mp_rank_XX/`` / ``tp_rank_XX_pp_rank_YYY/model_weights.ckpt``, ``model.``-prefixed
  state-dict keys, layers renumbered per stage (nemo-formats.md §1.4 a).
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from typing import Any, Callable

import torch
import yaml

GPT_TARGET = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"

_TOP = {"embedding.word_embeddings.weight": "language_model.embedding.word_embeddings.weight",
        "embedding.position_embeddings.weight": "language_model.embedding.position_embeddings.weight",
        "decoder.final_layernorm.weight": "language_model.encoder.final_layernorm.weight",
        "decoder.final_layernorm.bias": "language_model.encoder.final_layernorm.bias",
        "output_layer.weight": "language_model.output_layer.weight"}
_LAYER = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
          "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
          "self_attention.linear_qkv.weight": "self_attention.query_key_value.weight",
          "self_attention.linear_qkv.bias": "self_attention.query_key_value.bias",
          "self_attention.linear_proj.weight": "self_attention.dense.weight",
          "self_attention.linear_proj.bias": "self_attention.dense.bias",
          "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
          "mlp.linear_fc1.layer_norm_bias": "post_attention_layernorm.bias",
          "mlp.linear_fc1.weight": "mlp.dense_h_to_4h.weight",
          "mlp.linear_fc1.bias": "mlp.dense_h_to_4h.bias",
          "mlp.linear_fc2.weight": "mlp.dense_4h_to_h.weight",
          "mlp.linear_fc2.bias": "mlp.dense_4h_to_h.bias"}
_FAST = ("fast-swiglu", "fast-geglu", "fast-reglu")
_SEPARATE = ("swiglu", "geglu", "reglu")


def legacy_state(mcore: dict[str, torch.Tensor], cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Global Megatron-Core tensors → NeMo's legacy names (TP1, no ``model.`` prefix)."""
    out: dict[str, torch.Tensor] = {}
    separate = cfg["activation"] in _SEPARATE
    for name, t in mcore.items():
        m = re.match(r"^decoder\.layers\.(\d+)\.(.+)$", name)
        if m is None:
            out[_TOP[name]] = t
            continue
        layer, rest = m.groups()
        legacy = f"language_model.encoder.layers.{layer}.{_LAYER[rest]}"
        if separate and rest in ("mlp.linear_fc1.weight", "mlp.linear_fc1.bias"):
            gate, up = t.chunk(2, dim=0)
            out[legacy] = gate.clone()
            out[legacy.replace("dense_h_to_4h", "dense_h_to_4h_2")] = up.clone()
        else:
            out[legacy] = t
    if cfg.get("position_embedding_type") == "rope":
        d = int(cfg.get("kv_channels") or cfg["hidden_size"] // cfg["num_attention_heads"])
        rot = int(d * float(cfg.get("rotary_percentage", 1.0)))
        base = float(cfg.get("rotary_base", 10000.0))
        out["language_model.rotary_pos_emb.inv_freq"] = 1.0 / (base ** (torch.arange(0, rot, 2).float() / rot))
    return out


def _rank_slice(name: str, full: torch.Tensor, tp: int, rank: int, cfg: dict[str, Any]) -> torch.Tensor:
    """Rank ``rank``'s part of one TP1 legacy tensor (compute_tp_splits)."""
    legacy_qkv = "query_key_value" in name and cfg.get("megatron_legacy")
    if tp == 1 and not legacy_qkv:
        return full
    replicated = (full.dim() == 1 and not name.endswith(("query_key_value.bias", "dense_h_to_4h.bias",
                                                          "dense_h_to_4h_2.bias"))) \
        or "layernorm" in name or "position_embeddings" in name or "inv_freq" in name
    if replicated:
        return full.clone()
    if name.endswith(("self_attention.dense.weight", "dense_4h_to_h.weight")):  # same first dim
        return full.chunk(tp, dim=-1)[rank].clone()
    if "dense_h_to_4h." in name and cfg["activation"] in _FAST:
        w, v = full.chunk(2, dim=0)
        return torch.cat([w.chunk(tp, dim=0)[rank], v.chunk(tp, dim=0)[rank]]).clone()
    if legacy_qkv:
        heads = cfg["num_attention_heads"]
        per_head = full.reshape(heads, 3, -1, *full.shape[1:])  # [q_h; k_h; v_h] per head
        mine = per_head[rank * heads // tp:(rank + 1) * heads // tp]
        return mine.transpose(0, 1).reshape(-1, *full.shape[1:]).clone()  # [q_r; k_r; v_r]
    return full.chunk(tp, dim=0)[rank].clone()


def rank_states(state: dict[str, torch.Tensor], cfg: dict[str, Any], tp: int, pp: int
                ) -> dict[tuple[int, int], dict[str, torch.Tensor]]:
    """``(tp_rank, pp_rank)`` → that rank's ``model.``-prefixed state dict."""
    layers = cfg["num_layers"]
    per = layers // pp
    tied = cfg.get("share_embeddings_and_output_weights", True)
    out: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    for p in range(pp):
        for t in range(tp):
            sd: dict[str, torch.Tensor] = {}
            for name, full in state.items():
                m = re.match(r"^language_model\.encoder\.layers\.(\d+)\.(.+)$", name)
                if m is not None:
                    i = int(m[1])
                    if p * per <= i < (p + 1) * per:
                        sd[f"model.language_model.encoder.layers.{i - p * per}.{m[2]}"] = \
                            _rank_slice(name, full, tp, t, cfg)
                    continue
                last = name.startswith(("language_model.encoder.final_layernorm", "language_model.output_layer"))
                if (p == pp - 1) if last else (p == 0):
                    sd["model." + name] = _rank_slice(name, full, tp, t, cfg)
            if tied and pp > 1 and p == pp - 1:
                emb = state["language_model.embedding.word_embeddings.weight"]
                sd["model.word_embeddings.weight"] = _rank_slice("word_embeddings.weight", emb, tp, t, cfg)
            out[(t, p)] = sd
    return out


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def write_legacy_nemo(path: str, mcore: dict[str, torch.Tensor], cfg: dict[str, Any], *, tp: int = 1, pp: int = 1,
                      artifacts: dict[str, bytes] | None = None,
                      edit: Callable[[str, dict[str, torch.Tensor]], None] | None = None) -> str:
    """A legacy ``.nemo`` tar of the global Megatron-Core tensors ``mcore`` with config ``cfg``;
    ``edit(member, state)`` may change a weights file's state dict before it is saved."""
    cfg = {**cfg, "mcore_gpt": False, "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp}
    multiple = int(cfg.get("make_vocab_size_divisible_by") or 1) * tp  # Megatron's padding (§6.3), zeros
    padded = {}
    for k, t in mcore.items():
        if k in ("embedding.word_embeddings.weight", "output_layer.weight") and t.shape[0] % multiple:
            t = torch.cat([t, t.new_zeros(multiple - t.shape[0] % multiple, *t.shape[1:])])
        padded[k] = t
    state = legacy_state(padded, cfg)
    members: dict[str, bytes] = {"model_config.yaml": yaml.safe_dump(cfg, sort_keys=False).encode()}
    members.update(artifacts or {})
    files: dict[str, dict[str, torch.Tensor]] = {}
    if tp == pp == 1:
        files["model_weights.ckpt"] = {"model." + k: _rank_slice(k, v, 1, 0, cfg) for k, v in state.items()}
    else:
        for (t, p), sd in rank_states(state, cfg, tp, pp).items():
            folder = f"mp_rank_{t:02d}" if pp == 1 else f"tp_rank_{t:02d}_pp_rank_{p:03d}"
            files[f"{folder}/model_weights.ckpt"] = sd
    for member, sd in files.items():
        if edit is not None:
            edit(member, sd)
        members[member] = _torch_bytes(sd)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with tarfile.open(path, "w:") as tar:  # NeMo: mode "w:", arcname "." (nemo-formats.md §1.1)
        for name, data in members.items():
            info = tarfile.TarInfo("./" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def gpt3_style(seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A random GPT-3-style model (learned absolute positions, gelu, LayerNorm with bias,
    every linear bias, tied embeddings) as global Megatron-Core tensors, and its NeMo config
    (the fields of NeMo's 2022 ``nemo_gpt*`` configs, megatron_gpt_config.yaml)."""
    g = torch.Generator().manual_seed(seed)
    v, h, heads, f, layers, pos = 96, 32, 4, 128, 2, 64

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    mcore = {"embedding.word_embeddings.weight": r(v, h), "embedding.position_embeddings.weight": r(pos, h),
             "decoder.final_layernorm.weight": 1 + r(h), "decoder.final_layernorm.bias": r(h)}
    for i in range(layers):
        p = f"decoder.layers.{i}."
        mcore.update({p + "self_attention.linear_qkv.layer_norm_weight": 1 + r(h),
                      p + "self_attention.linear_qkv.layer_norm_bias": r(h),
                      p + "self_attention.linear_qkv.weight": r(3 * h, h), p + "self_attention.linear_qkv.bias": r(3 * h),
                      p + "self_attention.linear_proj.weight": r(h, h), p + "self_attention.linear_proj.bias": r(h),
                      p + "mlp.linear_fc1.layer_norm_weight": 1 + r(h), p + "mlp.linear_fc1.layer_norm_bias": r(h),
                      p + "mlp.linear_fc1.weight": r(f, h), p + "mlp.linear_fc1.bias": r(f),
                      p + "mlp.linear_fc2.weight": r(h, f), p + "mlp.linear_fc2.bias": r(h)})
    cfg = {"target": GPT_TARGET, "mcore_gpt": False, "num_layers": layers, "hidden_size": h, "ffn_hidden_size": f,
           "num_attention_heads": heads, "kv_channels": None, "max_position_embeddings": pos,
           "encoder_seq_length": pos, "position_embedding_type": "learned_absolute", "activation": "gelu",
           "normalization": "layernorm", "layernorm_epsilon": 1e-5, "bias": True,
           "share_embeddings_and_output_weights": True, "megatron_legacy": False, "transformer_block_type": "pre_ln",
           "make_vocab_size_divisible_by": 1, "precision": 32, "hidden_dropout": 0.1, "attention_dropout": 0.1,
           "tokenizer": {"library": "megatron", "type": "GPT2BPETokenizer", "model": None,
                         "vocab_file": None, "merge_file": None}}
    return mcore, cfg
