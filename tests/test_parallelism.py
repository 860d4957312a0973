"""Tensor/pipeline parallelism: import at any TP×PP, reshard between them, export back —
bit-identical; per-rank files equal slices computed independently here."""

from __future__ import annotations

import itertools
import os
import tarfile

import pytest
import torch
import yaml

from nemo_convert import api
from nemo_convert.errors import UnsupportedError
from tiny_models import hf_tensors

GEOM = dict(num_hidden_layers=6, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            vocab_size=1000, max_position_embeddings=64)



def assert_same(a: str, b: str) -> None:
    ta, tb = hf_tensors(a), hf_tensors(b)
    assert set(tb) <= set(ta) and set(ta) - set(tb) <= {"lm_head.weight"}
    for k in tb:
        assert torch.equal(ta[k], tb[k]), k


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    from tiny_models import make_tiny_llama

    base = tmp_path_factory.mktemp("src")
    return {g: make_tiny_llama(str(base / f"g{g}"), num_key_value_heads=g, **GEOM) for g in (1, 2, 4)}


@pytest.mark.parametrize("groups,tp,pp", list(itertools.product((1, 2, 4), (1, 2, 4), (1, 2, 3))))
def test_import_reshard_export_is_identity(tmp_path, sources, groups, tp, pp):
    src = sources[groups]
    a = str(tmp_path / "a.nemo")
    api.import_hf(src, a, layout="legacy", parallel=api.Parallelism(tp, pp))
    cfg = api.inspect_checkpoint(a)["config"]
    assert (cfg["tensor_model_parallel_size"], cfg["pipeline_model_parallel_size"]) == (tp, pp)
    # reshard to a different geometry (and across layouts), then export both
    tp2, pp2 = {1: 2, 2: 4, 4: 1}[tp], {1: 3, 2: 1, 3: 2}[pp]
    b = str(tmp_path / "b.nemo")
    api.reshard(a, b, tp=tp2, pp=pp2, layout="legacy")
    c = str(tmp_path / "c.nemo")
    api.reshard(b, c, tp=1, pp=1, layout="dist")
    for i, n in enumerate((a, b, c)):
        out = str(tmp_path / f"back{i}")
        api.export_hf(n, out)
        assert_same(src, out)


# -- independent slicing, written here without the library's sharding code -------------
def grouped_qkv(q, k, v, heads, groups):
    d = q.shape[0] // heads
    per = heads // groups
    rows = []
    for g in range(groups):
        rows += [q[(g * per + h) * d:(g * per + h + 1) * d] for h in range(per)]
        rows += [k[g * d:(g + 1) * d], v[g * d:(g + 1) * d]]
    return torch.cat(rows)


def expected_rank_tensors(hf, tp, pp, t, p, heads, groups, layers, vocab_pad):
    per_stage = layers // pp
    out = {}

    def chunk(x, dim):
        n = x.shape[dim] // tp
        return x.narrow(dim, t * n, n)

    if p == 0:
        emb = hf["model.embed_tokens.weight"]
        emb = torch.cat([emb, torch.zeros(vocab_pad - emb.shape[0], emb.shape[1], dtype=emb.dtype)])
        out["model.embedding.word_embeddings.weight"] = chunk(emb, 0)
    for local in range(per_stage):
        g = p * per_stage + local
        L, D = f"model.layers.{g}.", f"model.decoder.layers.{local}."
        qkv = grouped_qkv(hf[L + "self_attn.q_proj.weight"], hf[L + "self_attn.k_proj.weight"],
                          hf[L + "self_attn.v_proj.weight"], heads, groups)
        out[D + "self_attention.linear_qkv.weight"] = chunk(qkv, 0)
        out[D + "self_attention.linear_proj.weight"] = chunk(hf[L + "self_attn.o_proj.weight"], 1)
        out[D + "mlp.linear_fc1.weight"] = torch.cat([chunk(hf[L + "mlp.gate_proj.weight"], 0),
                                                      chunk(hf[L + "mlp.up_proj.weight"], 0)])
        out[D + "mlp.linear_fc2.weight"] = chunk(hf[L + "mlp.down_proj.weight"], 1)
        out[D + "self_attention.linear_qkv.layer_norm_weight"] = hf[L + "input_layernorm.weight"]
        out[D + "mlp.linear_fc1.layer_norm_weight"] = hf[L + "post_attention_layernorm.weight"]
    if p == pp - 1:
        out["model.decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        head = hf["lm_head.weight"]
        head = torch.cat([head, torch.zeros(vocab_pad - head.shape[0], head.shape[1], dtype=head.dtype)])
        out["model.output_layer.weight"] = chunk(head, 0)
    return out


@pytest.mark.parametrize("tp,pp", [(2, 1), (2, 3), (4, 2)])
def test_legacy_rank_files_are_the_defined_slices(tmp_path, sources, tp, pp):
    src = sources[2]
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo, layout="legacy", parallel=api.Parallelism(tp, pp))
    hf = hf_tensors(src)
    div = 8  # largest power of two ≤ 128 dividing 1000
    vocab_pad = -(-1000 // (div * tp)) * div * tp
    with tarfile.open(nemo) as tar:
        names = set(tar.getnames())
        cfg = yaml.safe_load(tar.extractfile("./model_config.yaml"))
        assert cfg["nemo_convert"]["vocab_size"] == 1000
        assert cfg["nemo_convert"]["padded_vocab_size"] == vocab_pad
        for p in range(pp):
            for t in range(tp):
                folder = f"mp_rank_{t:02d}" if pp == 1 else f"tp_rank_{t:02d}_pp_rank_{p:03d}"
                assert f"./{folder}/model_weights.ckpt" in names
                got = torch.load(tar.extractfile(f"./{folder}/model_weights.ckpt"), weights_only=True)
                want = expected_rank_tensors(hf, tp, pp, t, p, 4, 2, 6, vocab_pad)
                assert set(got) == set(want), (folder, set(got) ^ set(want))
                for k in want:
                    assert torch.equal(got[k], want[k]), (folder, k)


def test_vocab_padding_round_trips_at_tp8(tmp_path):
    from tiny_models import make_tiny_llama

    src = make_tiny_llama(str(tmp_path / "hf"), num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                          num_attention_heads=8, num_key_value_heads=8, vocab_size=1000)
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo, layout="legacy", parallel=api.Parallelism(8, 1))
    with tarfile.open(nemo) as tar:
        emb = torch.load(tar.extractfile("./mp_rank_07/model_weights.ckpt"), weights_only=True)[
            "model.embedding.word_embeddings.weight"]
    assert emb.shape[0] * 8 == 1024  # 1000 padded to a multiple of 8 × 8
    assert torch.count_nonzero(emb[-24:]) == 0  # the padding rows are zero and sit on the last rank
    back = str(tmp_path / "back")
    api.export_hf(nemo, back)
    assert hf_tensors(back)["model.embed_tokens.weight"].shape[0] == 1000
    assert_same(src, back)


@pytest.mark.parametrize("pp", [2, 3])
def test_tied_embeddings_with_pipeline_parallelism(tmp_path, pp):
    from tiny_models import make_tiny_llama

    src = make_tiny_llama(str(tmp_path / "hf"), tie_word_embeddings=True, num_key_value_heads=2, **GEOM)
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo, layout="legacy", parallel=api.Parallelism(2, pp))
    with tarfile.open(nemo) as tar:
        last = torch.load(tar.extractfile(f"./tp_rank_01_pp_rank_{pp - 1:03d}/model_weights.ckpt"), weights_only=True)
        first = torch.load(tar.extractfile("./tp_rank_01_pp_rank_000/model_weights.ckpt"), weights_only=True)
    key = "model.embedding.word_embeddings.weight"
    assert torch.equal(last[key], first[key])  # duplicated on the last stage
    assert "model.output_layer.weight" not in last
    back = str(tmp_path / "back")
    api.export_hf(api.reshard(nemo, str(tmp_path / "r.nemo"), tp=1, pp=2).output, back)
    assert_same(src, back)


def test_explicit_stage_sizes(tmp_path, sources):
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(sources[2], nemo, layout="legacy", parallel=api.Parallelism(1, 2, (2, 4)))
    with tarfile.open(nemo) as tar:
        s1 = torch.load(tar.extractfile("./tp_rank_00_pp_rank_001/model_weights.ckpt"), weights_only=True)
    assert {k.split(".")[3] for k in s1 if k.startswith("model.decoder.layers.")} == {"0", "1", "2", "3"}
    back = str(tmp_path / "back")
    api.export_hf(nemo, back)
    assert_same(sources[2], back)


@pytest.mark.parametrize("tp,pp,stages,match", [
    (3, 1, None, "num_attention_heads"),
    (1, 7, None, "larger than the number of layers"),
    (1, 4, None, "evenly"),
    (1, 2, (1, 2), "do not split"),
    (1, 1, (2, 2), r"name 2 pipeline stage\(s\) but the pipeline size is 1: pass --pp 2"),  # issue 20
])
def test_geometry_errors_before_writing(tmp_path, sources, tp, pp, stages, match):
    out = tmp_path / "m.nemo"
    with pytest.raises(UnsupportedError, match=match):
        api.import_hf(sources[2], str(out), layout="legacy", parallel=api.Parallelism(tp, pp, stages))
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if "partial" in p]


def test_dist_layout_records_parallelism_and_keeps_global_tensors(tmp_path, sources):
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(sources[2], nemo, parallel=api.Parallelism(2, 3))
    info = api.inspect_checkpoint(nemo)
    assert info["layout"] == "dist"
    assert info["config"]["tensor_model_parallel_size"] == 2
    names = {t["name"]: t["shape"] for t in info["tensors"]}
    assert names["embedding.word_embeddings.weight"] == [1000, 32]
    back = str(tmp_path / "back")
    api.export_hf(nemo, back)
    assert_same(sources[2], back)


def _write_nemo2(folder: str, nemo_file: str, *, per_layer_fc1: bool = False, prefix: str = "module.") -> None:
    """A NeMo 2.0 folder built from an imported .nemo's tensors: weights/ + context/, whose
    ``model.yaml`` holds what NeMo's ``HFLlamaImporter.config`` passes ``LlamaConfig`` (NeMo 8cfedd7
    ``llama.py`` lines 754-775) and nothing else: NeMo writes the call's arguments only."""
    from nemo_convert.formats.dist_checkpoint.distckpt_write import DistCheckpointWriter
    from nemo_convert.formats.nemo.nemo_weights import DistWeightsWriter
    from nemo_convert.formats.io.sink import DirectorySink

    with api.open_checkpoint(nemo_file) as ck:
        cfg = ck.config
        sink = DirectorySink(folder)
        infos = [ck.source.info(k) for k in ck.source.keys()]
        if not per_layer_fc1:
            w = DistWeightsWriter(sink, infos, prefix=prefix, folder="weights")
            for k in ck.source.keys():
                w.write(k, ck.source.load(k))
            w.close()
        else:  # Megatron ≥ 0.15 layout: per-layer keys, fc1 split into weight_w / weight_v
            w2 = DistCheckpointWriter(sink, "weights")
            for k in ck.source.keys():
                t = ck.source.load(k)
                if k.endswith("mlp.linear_fc1.weight"):
                    half = t.shape[0] // 2
                    for suffix, part in (("weight_w", t[:half]), ("weight_v", t[half:])):
                        name = prefix + k[: -len("weight")] + suffix
                        w2.declare(name, tuple(part.shape), part.dtype)
                        w2.write_chunk(name, (0, 0), part)
                else:
                    w2.declare(prefix + k, tuple(t.shape), t.dtype)
                    w2.write_chunk(prefix + k, (0,) * t.dim(), t)
            w2.close()
        tok = ck.handle.artifact(cfg["tokenizer"]["model"])
    os.makedirs(os.path.join(folder, "context", "nemo_tokenizer"), exist_ok=True)
    with open(os.path.join(folder, "context", "nemo_tokenizer", "tokenizer.model"), "wb") as f:
        f.write(tok)
    model_yaml = {
        "_target_": "nemo.collections.llm.gpt.model.llama.LlamaModel",
        "config": {"_target_": "nemo.collections.llm.gpt.model.llama.LlamaConfig",
                   "num_layers": cfg["num_layers"], "hidden_size": cfg["hidden_size"],
                   "ffn_hidden_size": cfg["ffn_hidden_size"], "num_attention_heads": cfg["num_attention_heads"],
                   "num_query_groups": cfg["num_query_groups"], "kv_channels": cfg["kv_channels"],
                   "seq_length": cfg["encoder_seq_length"], "rotary_base": cfg["rotary_base"],
                   "layernorm_epsilon": cfg["layernorm_epsilon"], "init_method_std": 0.02,
                   "gated_linear_unit": True, "fp16": False, "bf16": False, "generation_config": None,
                   "params_dtype": {"_target_": "torch.float32", "_call_": False},
                   "share_embeddings_and_output_weights": False, "make_vocab_size_divisible_by": 8},
        "tokenizer": {"_target_": "nemo.collections.common.tokenizers.sentencepiece_tokenizer.SentencePieceTokenizer"},
    }
    with open(os.path.join(folder, "context", "model.yaml"), "w") as f:
        yaml.safe_dump(model_yaml, f)


@pytest.mark.parametrize("per_layer_fc1", [False, True])
def test_nemo2_folder_exports_and_reshards(tmp_path, sources, per_layer_fc1):
    src = sources[2]
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo)
    folder = str(tmp_path / "nemo2")
    _write_nemo2(folder, nemo, per_layer_fc1=per_layer_fc1)
    info = api.inspect_checkpoint(folder)
    assert info["family"] == "llama"
    back = str(tmp_path / "back")
    api.export_hf(folder, back)
    assert_same(src, back)
    with open(os.path.join(back, "tokenizer.model"), "rb") as f, open(os.path.join(src, "tokenizer.model"), "rb") as g:
        assert f.read() == g.read()
    r = str(tmp_path / "r.nemo")
    api.reshard(folder, r, tp=2, pp=2, layout="legacy")
    back2 = str(tmp_path / "back2")
    api.export_hf(r, back2)
    assert_same(src, back2)


def test_geometry_checks_each_shape_and_kind_once():
    """``check_geometry`` splits one ``meta`` tensor per distinct (shape, kind), not one per
    output (256 experts × 58 layers of equal shapes), and still refuses a shape TP cannot split."""
    from nemo_convert.convert.nemo_write import check_geometry
    from nemo_convert.mapping.planner import Plan, Task
    from nemo_convert.mapping.rules import Parallel
    from nemo_convert.plugins.manager import get_registry
    from nemo_convert.tensors.base import TensorInfo

    real = get_registry().strategies()
    calls = []

    class Counting:
        def local_shape(self, shape, kind, tp, *, padded_vocab=None):  # type: ignore[no-untyped-def]
            calls.append((shape, kind))
            return real.tensor.local_shape(shape, kind, tp, padded_vocab=padded_vocab)

    def plan(rows: int) -> Plan:
        infos = [TensorInfo(f"e{i}.{n}", (rows, 8), torch.bfloat16) for i in range(50) for n in ("fc1", "fc2")]
        return Plan("to_nemo", [Task((i.name,), (i.name,), lambda x: x, (Parallel.REPLICATED,), (i,)) for i in infos])

    kinds = {f"e{i}.fc1": Parallel.COLUMN for i in range(50)} | {f"e{i}.fc2": Parallel.ROW for i in range(50)}
    strategies = real.with_tensor(Counting())  # type: ignore[arg-type]
    cfg = {"num_layers": 2}
    check_geometry(cfg, plan(16), kinds, api.Parallelism(2, 1), None, strategies)
    assert sorted(calls, key=str) == [((16, 8), Parallel.COLUMN), ((16, 8), Parallel.ROW)]
    with pytest.raises(UnsupportedError):  # 15 rows do not split over TP 2
        check_geometry(cfg, plan(15), kinds, api.Parallelism(2, 1), None, strategies)
