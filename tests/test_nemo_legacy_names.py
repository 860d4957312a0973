"""NeMo's pre-Megatron-Core GPT checkpoints (``mcore_gpt: false``: ``model.language_model.…``
names) read as Megatron-Core tensors, at TP1 (``model_weights.ckpt``) and per rank
(``mp_rank_XX/``, ``tp_rank_XX_pp_rank_YYY/``), merged by NeMo's legacy split rules.

The fixtures (:mod:`legacy_nemo`) are written from NeMo's own key table
(``convert_gpt_nemo_to_mcore.py`` ``build_key_mapping``) and split rules
(``megatron_change_num_partitions.py`` ``compute_tp_splits``), independently of the reader:

* a Llama-style legacy ``.nemo`` (RMSNorm, RoPE with the stored ``inv_freq``, untied, SwiGLU
  in both of NeMo's spellings: a fused ``dense_h_to_4h`` (``fast-swiglu``) and
  ``dense_h_to_4h`` + ``dense_h_to_4h_2`` (``swiglu``)), exported to HF bit-exactly with
  transformers' logits unchanged;
* a GPT-3-style one (learned positions, GELU, LayerNorm with bias, every linear bias, tied),
  as NVIDIA's 2022 ``nemo_gpt*`` checkpoints, read into exactly the Megatron-Core tensors a
  GPT mapping needs (its export needs the GPT-2 family of a parallel branch).
"""

from __future__ import annotations

import json
import os
import tarfile
from typing import Any

import pytest
import torch
import yaml

from legacy_nemo import gpt3_style, write_legacy_nemo
from nemo_convert import api
from tiny_models import hf_tensors, read_json

GRID = [(1, 1), (2, 1), (1, 2), (2, 2)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: Any) -> dict[str, Any]:
    """A tiny MHA Llama (legacy NeMo attention has no query groups: attention.py lines
    193-195), its Megatron-Core tensors and NeMo config as our import writes them, made into
    the config of a NeMo-written legacy GPT (no ``nemo_convert`` record)."""
    from nemo_convert.examples import make_tiny_llama

    root = tmp_path_factory.mktemp("legacy_llama")
    src = make_tiny_llama(str(root / "hf"), num_key_value_heads=4, vocab_size=300)
    api.import_hf(src, str(root / "m.nemo"))
    with api.open_checkpoint(str(root / "m.nemo")) as ck:
        mcore = {k: ck.source.load(k).clone() for k in ck.source.keys()}
        cfg = dict(ck.config)
    with tarfile.open(root / "m.nemo") as tar:
        arts = {m.name.removeprefix("./"): tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile() and m.name.endswith(".model")}
    cfg.pop("nemo_convert")
    cfg.update(transformer_engine=False, num_query_groups=None, megatron_legacy=False)
    return {"src": src, "mcore": mcore, "cfg": cfg, "arts": arts, "root": root}


def _legacy_llama(llama: dict[str, Any], path: str, spelling: str, tp: int, pp: int, **kw: Any) -> str:
    return write_legacy_nemo(path, llama["mcore"], {**llama["cfg"], "activation": spelling}, tp=tp, pp=pp,
                             artifacts=llama["arts"], **kw)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _logical(path: str) -> dict[str, torch.Tensor]:
    with api.open_checkpoint(path) as ck:
        return {k: ck.source.load(k).clone() for k in ck.source.keys()}


# -------------------------------------------------------------------- Llama-style
@pytest.mark.parametrize("spelling", ["fast-swiglu", "swiglu"])
@pytest.mark.parametrize("tp,pp", GRID)
def test_llama_style_legacy_exports_equal(llama: dict[str, Any], tmp_path: Any, spelling: str, tp: int,
                                          pp: int) -> None:
    nemo = _legacy_llama(llama, str(tmp_path / "l.nemo"), spelling, tp, pp)
    rep = api.export_hf(nemo, str(tmp_path / "hf"))
    assert rep.family == "llama" and not rep.warnings, rep.warnings
    assert any("pre-Megatron-Core" in n for n in rep.notes) and any("inv_freq" in n for n in rep.notes)
    assert _same(hf_tensors(llama["src"]), hf_tensors(str(tmp_path / "hf")))
    want, got = read_json(os.path.join(llama["src"], "config.json")), read_json(str(tmp_path / "hf/config.json"))
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "rms_norm_eps", "hidden_act", "tie_word_embeddings"):
        assert got[key] == want[key], key


@pytest.mark.parametrize("spelling", ["fast-swiglu", "swiglu"])
def test_llama_style_legacy_logits_unchanged(llama: dict[str, Any], tmp_path: Any, spelling: str) -> None:
    from transformers import AutoModelForCausalLM

    nemo = _legacy_llama(llama, str(tmp_path / "l.nemo"), spelling, 2, 2)
    api.export_hf(nemo, str(tmp_path / "hf"))
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(llama["src"], dtype=torch.float32).eval()(ids).logits
        b = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()(ids).logits
    assert torch.equal(a, b)  # Δ = 0


def test_inspect_and_verify_legacy(llama: dict[str, Any], tmp_path: Any, cli: Any) -> None:
    nemo = _legacy_llama(llama, str(tmp_path / "l.nemo"), "swiglu", 2, 1)
    code, out, err = cli("inspect", nemo, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["layout"] == "legacy" and info["family"] == "llama"
    names = {t["name"] for t in info["tensors"]}
    assert "decoder.layers.1.mlp.linear_fc1.weight" in names and not any("language_model" in n for n in names)
    assert any("pre-Megatron-Core" in n for n in info["notes"])
    fc1 = next(t for t in info["tensors"] if t["name"] == "decoder.layers.0.mlp.linear_fc1.weight")
    assert fc1["shape"] == [2 * 96, 64]
    code, out, err = cli("verify", llama["src"], nemo)
    assert code == 0, out + err


def test_reads_as_the_megatron_core_tensors(llama: dict[str, Any], tmp_path: Any) -> None:
    """Every legacy spelling and split reads to the same Megatron-Core tensors (the padded
    vocabulary rows dropped by the tokenizer's size, as for any NeMo file)."""
    base = _logical(_legacy_llama(llama, str(tmp_path / "a.nemo"), "fast-swiglu", 1, 1))
    assert set(base) == set(llama["mcore"])
    for spelling in ("fast-swiglu", "swiglu"):
        for tp, pp in GRID:
            got = _logical(_legacy_llama(llama, str(tmp_path / f"{spelling}{tp}{pp}.nemo"), spelling, tp, pp))
            assert sorted(got) == sorted(base), (spelling, tp, pp)
            for k in base:  # rows past the 300-token tokenizer are Megatron's zero padding
                assert torch.equal(got[k][:300] if "word_emb" in k or "output_layer" in k else got[k],
                                   base[k][:300] if "word_emb" in k or "output_layer" in k else base[k]), k


@pytest.mark.parametrize("layout,tp,pp", [("dist", 1, 1), ("dist", 2, 1), ("legacy", 2, 2), ("legacy", 1, 1)])
def test_reshard_writes_megatron_core_names(llama: dict[str, Any], tmp_path: Any, layout: str, tp: int,
                                            pp: int) -> None:
    """``reshard`` rewrites a legacy .nemo under Megatron-Core names (``mcore_gpt: true``), in
    the dist layout or the per-rank layout, for NeMo 2 / Megatron-Bridge to train on."""
    src = _legacy_llama(llama, str(tmp_path / "l.nemo"), "swiglu", 2, 1)
    out = str(tmp_path / "out.nemo")
    api.reshard(src, out, tp=tp, pp=pp, layout=layout)
    with tarfile.open(out) as tar:
        names = [m.name.removeprefix("./") for m in tar.getmembers()]
        cfg = yaml.safe_load(tar.extractfile("./model_config.yaml").read())  # type: ignore[union-attr]
        weights = [n for n in names if n.endswith("model_weights.ckpt")]
        keys = set()
        for w in weights:
            import io

            keys |= set(torch.load(io.BytesIO(tar.extractfile("./" + w).read()), weights_only=True))  # type: ignore[union-attr]
    assert cfg["mcore_gpt"] is True and cfg["activation"] == "fast-swiglu"
    if layout == "dist":
        assert "model_weights/metadata.json" in names and not weights
    else:
        assert weights and all(k.startswith(("model.decoder.", "model.embedding.", "model.output_layer."))
                               for k in keys), sorted(keys)[:5]
    api.export_hf(out, str(tmp_path / "hf"))
    assert _same(hf_tensors(llama["src"]), hf_tensors(str(tmp_path / "hf")))


# ------------------------------------------------------------------ GPT-3-style
@pytest.mark.parametrize("tp,pp,megatron_legacy", [(1, 1, False), (2, 1, False), (1, 2, False), (2, 2, False),
                                                   (4, 1, False), (1, 1, True), (2, 2, True)])
def test_gpt3_style_reads_as_megatron_core_tensors(tmp_path: Any, tp: int, pp: int, megatron_legacy: bool) -> None:
    """Names, shapes, dtypes and values of exactly the Megatron-Core tensors a GPT mapping
    takes (learned positions, every bias, no output layer: tied). TP2 is how
    nemo_gpt5B_fp16_tp2.nemo is stored; reading it used to stop at ``stage sizes [0] do
    not split 0 layers into 1 stages``."""
    mcore, cfg = gpt3_style()
    nemo = write_legacy_nemo(str(tmp_path / "g.nemo"), mcore, {**cfg, "megatron_legacy": megatron_legacy},
                             tp=tp, pp=pp)
    with api.open_checkpoint(nemo) as ck:
        assert ck.layout == "legacy" and ck.config["mcore_gpt"] is True
        got = {k: ck.source.load(k).clone() for k in ck.source.keys()}
        infos = {k: ck.source.info(k) for k in ck.source.keys()}
    assert _same(mcore, got)
    assert all(tuple(infos[k].shape) == tuple(mcore[k].shape) for k in mcore)


@pytest.mark.parametrize("tp", [1, 2])
def test_gpt3_style_legacy_exports(tmp_path: Any, tp: int) -> None:
    """Export to HF's GPT-2 class, which loads it; importing that folder back gives the
    source's Megatron-Core tensors."""
    from transformers import AutoModelForCausalLM

    mcore, cfg = gpt3_style()
    nemo = write_legacy_nemo(str(tmp_path / "g.nemo"), mcore, cfg, tp=tp)
    api.export_hf(nemo, str(tmp_path / "hf"))
    assert read_json(str(tmp_path / "hf/config.json"))["architectures"] == ["GPT2LMHeadModel"]
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    api.import_hf(str(tmp_path / "hf"), str(tmp_path / "back.nemo"))
    assert _same(mcore, _logical(str(tmp_path / "back.nemo")))


# ----------------------------------------------------------------------- hostile
def _refused(cli: Any, tmp_path: Any, nemo: str, match: str) -> None:
    code, _, err = cli("export", nemo, "-o", str(tmp_path / "never"))
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(tmp_path / "never")
    assert not [n for n in os.listdir(tmp_path) if "partial" in n]


def _edit_rank(member: str, name: str, fn: Any) -> Any:
    def edit(m: str, sd: dict[str, torch.Tensor]) -> None:
        if m == member:
            fn(sd, name)
    return edit


QKV = "model.language_model.encoder.layers.0.self_attention.query_key_value.weight"


@pytest.mark.parametrize("case, kw, match", [
    ("rank shapes differ", dict(tp=2, edit=_edit_rank("mp_rank_01/model_weights.ckpt", QKV,
                                                      lambda sd, n: sd.__setitem__(n, sd[n][:-8]))),
     "has 88 rows; NeMo's legacy attention has 3 × 2 heads"),
    ("rank slices differ", dict(tp=2, edit=_edit_rank(
        "mp_rank_01/model_weights.ckpt", "model.language_model.encoder.layers.1.mlp.dense_4h_to_h.weight",
        lambda sd, n: sd.__setitem__(n, sd[n][:, :-1]))),
     "decoder.layers.1.mlp.linear_fc2.weight: the tensor-parallel slices differ in shape"),
    ("rank tensors differ", dict(tp=2, edit=_edit_rank("mp_rank_01/model_weights.ckpt", QKV,
                                                       lambda sd, n: sd.pop(n))),
     "hold different tensors"),
    ("unknown legacy name", dict(edit=_edit_rank("model_weights.ckpt", "x", lambda sd, n: sd.__setitem__(
        "model.language_model.encoder.layers.0.adapter_layer.lora.weight", torch.zeros(2)))),
     "not understood: language_model.encoder.layers.0.adapter_layer.lora.weight"),
    ("missing up half", dict(spelling="swiglu", edit=_edit_rank(
        "model_weights.ckpt", "model.language_model.encoder.layers.1.mlp.dense_h_to_4h_2.weight",
        lambda sd, n: sd.pop(n))),
     "decoder.layers.1.mlp.linear_fc1.weight needs dense_h_to_4h and dense_h_to_4h_2"),
    ("post_ln", dict(cfg=dict(transformer_block_type="post_ln")), "transformer_block_type='post_ln'"),
    ("no layers", dict(tp=2, edit=lambda m, sd: [sd.pop(k) for k in list(sd) if ".layers." in k]),
     "hold no decoder layers"),
])
def test_bad_legacy_checkpoints_are_one_line(llama: dict[str, Any], tmp_path: Any, cli: Any, case: str,
                                             kw: dict[str, Any], match: str) -> None:
    spelling = kw.pop("spelling", "fast-swiglu")
    cfg = {**llama["cfg"], "activation": spelling, **kw.pop("cfg", {})}
    tp = kw.pop("tp", 1)
    nemo = write_legacy_nemo(str(tmp_path / "bad.nemo"), llama["mcore"], cfg, tp=tp, artifacts=llama["arts"], **kw)
    _refused(cli, tmp_path, nemo, match)
