"""The ``.nemo`` written by ``import`` matches NeMo's own (reference: nemo-formats.md §1.1–1.6,
§2.2–2.6 and megatron-compat.md): the tar container, the artifact naming, the
``torch_dist`` folder read back with torch's own ``torch.distributed.checkpoint``, the
legacy ``model_weights.ckpt`` and the ``model_config.yaml`` fields.

Expected values are computed here independently from the HF tensors and config; nothing
is taken from nemo-convert's own mapping code."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile

import pytest
import torch
import torch.distributed.checkpoint as dcp
import yaml
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

from nemo_convert import api
from tiny_models import make_tiny_llama

# A GQA Llama whose head_dim (24) is not hidden/heads (16), with every size distinct.
L, H, F, NH, NG, D, V = 3, 64, 96, 4, 2, 24, 320
ROPE = {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
        "original_max_position_embeddings": 128}
GEOMETRY = {"num_hidden_layers": L, "hidden_size": H, "intermediate_size": F, "num_attention_heads": NH,
            "num_key_value_heads": NG, "head_dim": D, "vocab_size": V, "max_position_embeddings": 256,
            "rope_theta": 500000.0, "rms_norm_eps": 1e-6, "rope_scaling": ROPE}
TORCH_DIST_JSON = {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}
P = "model.decoder.layers."
STACKED_SHAPES = {  # nemo-formats.md §1.6, with the model. prefix
    "model.embedding.word_embeddings.weight": (V, H),
    P + "self_attention.linear_qkv.layer_norm_weight": (L, H),
    P + "self_attention.linear_qkv.weight": (L, (NH + 2 * NG) * D, H),
    P + "self_attention.linear_proj.weight": (L, H, NH * D),
    P + "mlp.linear_fc1.layer_norm_weight": (L, H),
    P + "mlp.linear_fc1.weight": (L, 2 * F, H),
    P + "mlp.linear_fc2.weight": (L, H, F),
    "model.decoder.final_layernorm.weight": (H,),
    "model.output_layer.weight": (V, H),
}
EXTRA_STATE_MODULES = ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1",
                       "mlp.linear_fc2", "self_attention.core_attention")


# --------------------------------------------------------------------------- fixtures
def hf_weights(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


def extract(nemo: str, dest: str) -> str:
    with tarfile.open(nemo, "r:") as t:
        t.extractall(dest, filter="data")
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("layout")
    hf = make_tiny_llama(str(base / "hf"), dtype=torch.bfloat16, **GEOMETRY)
    out = {"hf": hf, "tensors": hf_weights(hf)}
    for layout in ("dist", "legacy"):
        nemo = str(base / f"{layout}.nemo")
        api.import_hf(hf, nemo, layout=layout)
        out[layout] = nemo
        out[layout + "_dir"] = extract(nemo, str(base / f"{layout}_x"))
    tied = make_tiny_llama(str(base / "tied"), tokenizer=False, num_hidden_layers=2, tie_word_embeddings=True)
    api.import_hf(tied, str(base / "tied.nemo"))
    out["tied_dir"] = extract(str(base / "tied.nemo"), str(base / "tied_x"))
    with open(os.path.join(out["dist_dir"], "model_config.yaml")) as f:
        out["config"] = yaml.safe_load(f)
    return out


def expected_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Megatron's grouped order, row block by row block: per query group g, its NH/NG query
    heads, then k_g, then v_g (nemo-formats.md §2.3)."""
    per = NH // NG
    blocks = []
    for g in range(NG):
        for j in range(per):
            h = g * per + j
            blocks.append(q[h * D:(h + 1) * D])
        blocks.append(k[g * D:(g + 1) * D])
        blocks.append(v[g * D:(g + 1) * D])
    return torch.cat(blocks)


def expected_logical(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-layer NeMo tensors (unprefixed names) computed from the HF tensors."""
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": hf["model.norm.weight"],
           "output_layer.weight": hf["lm_head.weight"]}
    for i in range(L):
        h, n = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[n + "self_attention.linear_qkv.weight"] = expected_qkv(
            hf[h + "self_attn.q_proj.weight"], hf[h + "self_attn.k_proj.weight"], hf[h + "self_attn.v_proj.weight"])
        out[n + "self_attention.linear_qkv.layer_norm_weight"] = hf[h + "input_layernorm.weight"]
        out[n + "self_attention.linear_proj.weight"] = hf[h + "self_attn.o_proj.weight"]
        out[n + "mlp.linear_fc1.weight"] = torch.cat([hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]])
        out[n + "mlp.linear_fc1.layer_norm_weight"] = hf[h + "post_attention_layernorm.weight"]
        out[n + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"]
    return out


def test_expected_qkv_is_not_a_plain_concatenation():
    # guards the independent computation: with NG=2 the grouped order differs from [Q; K; V]
    q, k, v = (torch.arange(n * D, dtype=torch.float32).reshape(n * D, 1) + off
               for n, off in ((NH, 0), (NG, 1000), (NG, 2000)))
    fused = expected_qkv(q, k, v)
    assert fused.shape == ((NH + 2 * NG) * D, 1)
    assert not torch.equal(fused, torch.cat([q, k, v]))
    assert torch.equal(fused[2 * D:3 * D], k[:D]) and torch.equal(fused[3 * D:4 * D], v[:D])
    assert torch.equal(fused[4 * D:5 * D], q[2 * D:3 * D])


# --------------------------------------------------------------------------- container (§1.1–1.4)
@pytest.mark.parametrize("layout", ["dist", "legacy"])
def test_plain_tar_with_dot_slash_members(built, layout):
    with open(built[layout], "rb") as f:
        assert f.read(2) != b"\x1f\x8b"  # not gzipped
    with tarfile.open(built[layout], "r:") as t:
        members = t.getmembers()
    names = [m.name for m in members]
    assert all(n == "." or n.startswith("./") for n in names), names
    assert "./model_config.yaml" in names
    assert all(m.isfile() or m.isdir() for m in members)  # no links
    assert len(set(names)) == len(names)
    if layout == "dist":
        assert "./model_weights/metadata.json" in names and "./model_weights.ckpt" not in names
    else:
        assert "./model_weights.ckpt" in names and not any(n.startswith("./model_weights/") for n in names)


def test_tokenizer_artifact(built):
    with tarfile.open(built["dist"], "r:") as t:
        names = t.getnames()
        tok = [n for n in names if n.endswith("_tokenizer.model")]
        assert len(tok) == 1 and re.fullmatch(r"\./[0-9a-f]{32}_tokenizer\.model", tok[0]), names
        data = t.extractfile(tok[0]).read()
    with open(os.path.join(built["hf"], "tokenizer.model"), "rb") as f:
        assert data == f.read()
    section = built["config"]["tokenizer"]
    assert section["library"] == "sentencepiece"
    assert section["model"] == "nemo:" + tok[0][2:]


# --------------------------------------------------------------------------- torch_dist (§1.5–1.6)
def test_dist_folder_files(built):
    mw = os.path.join(built["dist_dir"], "model_weights")
    files = sorted(os.listdir(mw))
    assert {".metadata", "common.pt", "metadata.json"} <= set(files)
    data_files = [f for f in files if f not in (".metadata", "common.pt", "metadata.json")]
    assert data_files and all(re.fullmatch(r"__\d+_\d+\.distcp", f) for f in data_files), files
    with open(os.path.join(mw, "metadata.json"), "rb") as f:
        raw = f.read()
    assert json.loads(raw) == TORCH_DIST_JSON
    assert raw.decode() == json.dumps(TORCH_DIST_JSON)  # what Megatron's json.dump writes
    assert torch.load(os.path.join(mw, "common.pt"), weights_only=True) == {}


def _metadata(folder: str):
    return dcp.FileSystemReader(os.path.join(folder, "model_weights")).read_metadata()


def _split(md) -> tuple[dict[str, TensorStorageMetadata], set[str]]:
    tensors = {k: v for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    objects = {k for k, v in md.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)}
    assert len(tensors) + len(objects) == len(md.state_dict_metadata)
    return tensors, objects


def test_dcp_keys_and_global_shapes(built):
    tensors, _ = _split(_metadata(built["dist_dir"]))
    assert {k: tuple(v.size) for k, v in tensors.items()} == STACKED_SHAPES
    assert {v.properties.dtype for v in tensors.values()} == {torch.bfloat16}


def test_dcp_tied_has_no_output_layer(built):
    tensors, objects = _split(_metadata(built["tied_dir"]))
    assert "model.embedding.word_embeddings.weight" in tensors
    assert "model.output_layer.weight" not in tensors
    assert not any(k.startswith("model.output_layer.") for k in objects)
    assert set(tensors) == set(STACKED_SHAPES) - {"model.output_layer.weight"}


def test_dcp_extra_state_objects(built):
    _, objects = _split(_metadata(built["dist_dir"]))
    want = {f"{P}{m}._extra_state/shard_{i}_{L}" for m in EXTRA_STATE_MODULES for i in range(L)}
    assert want <= objects, sorted(want - objects)
    assert all(re.fullmatch(r"model\.[\w.]+\._extra_state/shard_\d+_\d+", k) for k in objects), sorted(objects)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_loads_with_torch_and_matches_hf(built):
    folder = os.path.join(built["dist_dir"], "model_weights")
    tensors, objects = _split(_metadata(built["dist_dir"]))
    state = {k: torch.full(tuple(v.size), float("nan"), dtype=v.properties.dtype) for k, v in tensors.items()}
    state.update({k: "placeholder" for k in objects})
    dcp.load(state, checkpoint_id=folder, no_dist=True)  # one process, no process group
    for k in objects:
        assert state[k] == [None], k

    want = expected_logical(built["tensors"])
    for key, value in state.items():
        if key in objects:
            continue
        logical = key[len("model."):]
        if logical.startswith("decoder.layers."):
            rest = logical[len("decoder.layers."):]
            for i in range(L):
                expect = want[f"decoder.layers.{i}.{rest}"]
                assert value[i].dtype == expect.dtype and torch.equal(value[i], expect), (key, i)
        else:
            assert torch.equal(value, want[logical]), key


# --------------------------------------------------------------------------- legacy (§2.2)
def test_legacy_model_weights_ckpt(built):
    sd = torch.load(os.path.join(built["legacy_dir"], "model_weights.ckpt"), weights_only=True,
                    map_location="cpu")
    want = {"model." + k: t for k, t in expected_logical(built["tensors"]).items()}
    weights = {k: v for k, v in sd.items() if not k.endswith("._extra_state")}
    assert set(weights) == set(want)
    assert len(want) == 3 + 6 * L
    for k, t in want.items():
        assert weights[k].dtype == torch.bfloat16 and torch.equal(weights[k], t), k


def test_both_layouts_hold_the_same_config(built):
    with open(os.path.join(built["legacy_dir"], "model_config.yaml")) as f:
        assert yaml.safe_load(f) == built["config"]


# --------------------------------------------------------------------------- model_config.yaml (§2.6)
def test_model_config_fields(built):
    cfg = built["config"]
    expected = {
        "mcore_gpt": True,
        "num_layers": L,
        "hidden_size": H,
        "ffn_hidden_size": F,
        "num_attention_heads": NH,
        "num_query_groups": NG,
        "kv_channels": D,
        "max_position_embeddings": 256,
        "encoder_seq_length": 256,
        "rotary_base": 500000.0,
        "layernorm_epsilon": 1e-6,
        "normalization": "rmsnorm",
        "activation": "fast-swiglu",
        "bias": False,
        "share_embeddings_and_output_weights": False,
        "make_vocab_size_divisible_by": 64,  # largest power of two <= 128 dividing 320
        "precision": "bf16",
        "position_embedding_type": "rope",
        "target": "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel",
    }
    assert {k: cfg.get(k) for k in expected} == expected
    assert "model" not in cfg  # NeMo refuses a model config with a key named model (§1.2)
    assert cfg["tokenizer"]["library"] == "sentencepiece"
    assert cfg["tokenizer"]["model"].startswith("nemo:")


def test_model_config_llama3_rope_scaling(built):
    cfg = built["config"]
    assert cfg["scale_positional_embedding"] is True
    assert cfg["scale_factor"] == 16.0
    assert cfg["low_freq_factor"] == 2.0
    assert cfg["high_freq_factor"] == 8.0
    assert cfg["old_context_len"] == 128
    assert not cfg.get("seq_len_interpolation_factor")


def test_model_config_of_a_tied_fp32_model(built):
    with open(os.path.join(built["tied_dir"], "model_config.yaml")) as f:
        cfg = yaml.safe_load(f)
    assert cfg["share_embeddings_and_output_weights"] is True
    assert cfg["precision"] == 32
    # head_dim 16 = hidden / heads: null, as NeMo's converter writes it (§2.6)
    assert cfg["kv_channels"] is None and cfg["num_query_groups"] == 2
    assert not cfg.get("scale_positional_embedding")
    assert "tokenizer" not in cfg or cfg["tokenizer"].get("model") is None


def test_archive_is_reproducible(built, tmp_path):
    again = str(tmp_path / "again.nemo")
    api.import_hf(built["hf"], again)

    def members(path):
        with tarfile.open(path, "r:") as t:
            return {m.name: hashlib.sha256(t.extractfile(m).read()).hexdigest()
                    for m in t.getmembers() if m.isfile()}

    assert members(again) == members(built["dist"])
