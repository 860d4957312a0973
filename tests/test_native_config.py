"""Export of a ``.nemo`` whose ``model_config.yaml`` NeMo wrote (no ``nemo_convert`` section).

The weights are ours (an import, then the config replaced by the NeMo-native one); the
same checks on weights Megatron-Core saved itself are in ``tests/test_read_megatron.py``.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest
import sentencepiece as spm
import torch
import yaml
from tiny_models import hf_tensors, make_tiny_llama, write_sentencepiece

from nemo_convert import api
from nemo_convert.convert.nemo_write import Parallelism

TARGET = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"


def _hf(folder: str, **overrides: Any) -> tuple[str, int]:
    """A tiny Llama whose vocabulary is its SentencePiece tokenizer's size (as for a real one)."""
    os.makedirs(folder)
    tok = write_sentencepiece(os.path.join(folder, "tokenizer.model"), vocab_size=200)
    vocab = spm.SentencePieceProcessor(model_file=tok).get_piece_size()
    make_tiny_llama(folder, tokenizer=False, vocab_size=vocab, **overrides)
    return folder, vocab


def _go_native(nemo: str, *, tokenizer: bool = True) -> dict[str, Any]:
    """Replace an unpacked ``.nemo``'s config with what NeMo's converter writes: no section of
    ours, NeMo's defaults for ``kv_channels`` (null) and ``apply_query_key_layer_scaling``
    (True) (megatron_llama_config.yaml L65-66 at NeMo 00a115fe), ``scale_positional_embedding: True``
    (convert_llama_hf_to_nemo.py L126, --llama31 default) and ModelPT's ``target``."""
    path = os.path.join(nemo, "model_config.yaml")
    with open(path) as f:
        cfg = yaml.safe_load(f)
    cfg.pop("nemo_convert")
    cfg.update(kv_channels=None, apply_query_key_layer_scaling=True, scale_positional_embedding=True,
               target=TARGET, nemo_version="2.0.0")
    if not tokenizer:
        cfg["tokenizer"] = {"library": "huggingface", "type": "meta-llama/Llama-2-7b-hf", "use_fast": True}
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return cfg


@pytest.mark.parametrize("tied", [False, True])
def test_native_config_exports_a_complete_config_json(tmp_path: Any, tied: bool) -> None:
    hf, vocab = _hf(str(tmp_path / "hf"), tie_word_embeddings=tied)
    api.import_hf(hf, str(tmp_path / "m.nemo"), packed=False)
    _go_native(str(tmp_path / "m.nemo"))
    rep = api.export_hf(str(tmp_path / "m.nemo"), str(tmp_path / "out"), rope_scaling=False)
    assert rep.warnings == []
    got, want = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("out", "hf"))
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "tie_word_embeddings", "head_dim",
                "num_key_value_heads"):
        assert got[key] == want[key], key
    assert got["torch_dtype"] == "float32" and "pad_token_id" not in got and "rope_scaling" not in got
    assert got["rope_theta"] == 10000.0
    a, b = hf_tensors(str(tmp_path / "out")), hf_tensors(hf)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in b)

    # as NeMo runs it: llama3 RoPE scaling with NeMo's defaults, and a one-line warning
    rep = api.export_hf(str(tmp_path / "m.nemo"), str(tmp_path / "scaled"))
    assert len(rep.warnings) == 1 and "\n" not in rep.warnings[0] and "--no-rope-scaling" in rep.warnings[0]
    scaled = json.loads((tmp_path / "scaled" / "config.json").read_text())
    assert scaled["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def test_padded_vocabulary_is_trimmed_to_the_tokenizer(tmp_path: Any) -> None:
    """Legacy TP=2 ranks hold the vocabulary padded to a multiple of divisible_by × 2."""
    hf, vocab = _hf(str(tmp_path / "hf"))
    api.import_hf(hf, str(tmp_path / "m.nemo"), packed=False, layout="legacy", parallel=Parallelism(2, 1))
    cfg = _go_native(str(tmp_path / "m.nemo"))
    assert cfg["make_vocab_size_divisible_by"] * 2 > vocab % (cfg["make_vocab_size_divisible_by"] * 2) > 0
    rep = api.export_hf(str(tmp_path / "m.nemo"), str(tmp_path / "out"), rope_scaling=False)
    assert rep.warnings == []
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == vocab
    a, b = hf_tensors(str(tmp_path / "out")), hf_tensors(hf)
    assert all(torch.equal(a[k], b[k]) for k in b)
    rep = api.reshard(str(tmp_path / "m.nemo"), str(tmp_path / "r.nemo"), tp=1, layout="dist")
    assert rep.warnings == []
    api.export_hf(str(tmp_path / "r.nemo"), str(tmp_path / "back"), rope_scaling=False)
    a = hf_tensors(str(tmp_path / "back"))
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_unknown_vocabulary_keeps_the_rows_with_a_warning(tmp_path: Any) -> None:
    hf, vocab = _hf(str(tmp_path / "hf"))
    api.import_hf(hf, str(tmp_path / "m.nemo"), packed=False, layout="legacy", parallel=Parallelism(2, 1))
    cfg = _go_native(str(tmp_path / "m.nemo"), tokenizer=False)
    div = cfg["make_vocab_size_divisible_by"] * 2
    rows = -(-vocab // div) * div
    rep = api.export_hf(str(tmp_path / "m.nemo"), str(tmp_path / "out"), rope_scaling=False)
    assert [w for w in rep.warnings if "true vocabulary size is unknown" in w and str(rows) in w]
    got = json.loads((tmp_path / "out" / "config.json").read_text())
    assert got["vocab_size"] == rows and "bos_token_id" not in got
    from transformers import LlamaForCausalLM

    _, info = LlamaForCausalLM.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not any(info.values()), info


def test_issue_12_nemo_with_megatron_0_15_metadata_through_the_cli(tmp_path: Any, cli: Any,
                                                                     monkeypatch: Any) -> None:
    """The reported failure: every command exited 2 on ``the .metadata pickle asks for
    megatron.core.dist_checkpointing.strategies.torch.MCoreSavePlan``. Here the ``.metadata``
    is pickled as Megatron-Core 0.15 pickled it (MCoreMetadata + all_local_plans of
    MCoreSavePlan + mcore_data, strategies/torch.py L462-545 at core_v0.15.0)."""
    import pickle

    from test_distckpt import _old_mcore_classes

    hf, _ = _hf(str(tmp_path / "hf"))
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(hf, nemo, packed=False)
    _go_native(nemo)
    path = os.path.join(nemo, "model_weights", ".metadata")
    mcore_md, mcore_plan = _old_mcore_classes(monkeypatch)
    with open(path, "rb") as f:
        md = pickle.load(f)  # written by our own import a moment ago
    mcore_data = {k: {} for k in md.state_dict_metadata}
    md = mcore_md(mcore_data=mcore_data, **vars(md))
    md.all_local_plans = [mcore_plan(items=[], planner_data={}, mcore_data=mcore_data)]
    with open(path, "wb") as f:
        pickle.dump(md, f)
    monkeypatch.undo()
    code, _, err = cli("inspect", nemo)
    assert code == 0, err
    code, _, err = cli("export", nemo, "-o", str(tmp_path / "out"), "--no-rope-scaling")
    assert code == 0, err
    code, _, err = cli("reshard", nemo, "-o", str(tmp_path / "r.nemo"), "--tp", "2", "--layout", "legacy")
    assert code == 0, err
    code, out, err = cli("verify", nemo, str(tmp_path / "out"), "--json")
    assert "not allowed" not in err and all(t["status"] == "equal" for t in json.loads(out)["tensors"])
    a, b = hf_tensors(str(tmp_path / "out")), hf_tensors(hf)
    assert all(torch.equal(a[k], b[k]) for k in b)


def _v4(hf: str, folder: str, **changes: Any) -> str:
    """A copy of ``hf`` whose config.json is spelled as transformers 4 wrote it."""
    shutil.copytree(hf, folder)
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters")
    cfg.update({"torch_dtype": cfg.pop("dtype"), "rope_theta": rope["rope_theta"], "rope_scaling": None,
                "transformers_version": "4.51.3", **changes})
    with open(path, "w") as f:
        json.dump(cfg, f)
    return folder


def test_native_config_verifies_against_its_hf_source(tmp_path: Any, cli: Any) -> None:
    """Configs are compared by meaning: v4 and v5 spellings alike, what a NeMo config cannot
    record a note; RoPE scaling and real changes stay differences."""
    hf, _ = _hf(str(tmp_path / "hf"))
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(hf, nemo, packed=False)
    _go_native(nemo)
    v4 = _v4(hf, str(tmp_path / "v4"))
    for source in (hf, v4):
        rep = api.verify(nemo, source, rope_scaling=False)
        assert rep.ok, rep.config
        assert [n for n in rep.notes if n.startswith("config: ") and "transformers_version" in n]
        rep = api.verify(source, nemo)  # as NeMo runs it: llama3 scaling, which the source has not
        assert [(c.path, c.kind, c.b["rope_type"]) for c in rep.config] == [("rope_scaling", "changed", "llama3")]
    code, out, err = cli("verify", nemo, v4, "--no-rope-scaling")
    assert code == 0 and "OK" in out, out + err
    eps = _v4(hf, str(tmp_path / "eps"), rms_norm_eps=1e-6, rope_theta=5e5)
    rep = api.verify(nemo, eps, rope_scaling=False)
    assert sorted((c.path, c.kind) for c in rep.config) == [("rms_norm_eps", "changed"), ("rope_theta", "changed")]
    with open(os.path.join(hf, "config.json")) as f:
        v5 = json.load(f)
    v5["rope_parameters"]["rope_theta"] = 5e5
    v5["num_key_value_heads"] = 4
    shutil.copytree(hf, tmp_path / "v5")
    (tmp_path / "v5" / "config.json").write_text(json.dumps(v5))
    rep = api.verify(nemo, str(tmp_path / "v5"), rope_scaling=False)
    assert sorted((c.path, c.a, c.b) for c in rep.config) == [("num_key_value_heads", 2, 4),
                                                               ("rope_theta", 10000.0, 5e5)]
    code, out, _ = cli("verify", nemo, eps, "--no-rope-scaling")
    assert code == 1 and "MISMATCH" in out and "rms_norm_eps" in out


def test_native_config_quantizes_with_the_true_vocabulary(tmp_path: Any) -> None:
    """quantize completes a NeMo-native config as export does: the padded rows trimmed."""
    from safetensors.torch import load_file

    from nemo_convert.qnemo import quantize

    hf, vocab = _hf(str(tmp_path / "hf"))
    api.import_hf(hf, str(tmp_path / "m.nemo"), packed=False, layout="legacy", parallel=Parallelism(2, 1))
    _go_native(str(tmp_path / "m.nemo"))
    rep = quantize(str(tmp_path / "m.nemo"), str(tmp_path / "q.qnemo"), algo="none", rope_scaling=False)
    assert rep.warnings == []
    cfg = json.loads((tmp_path / "q.qnemo" / "config.json").read_text())
    assert cfg["vocab_size"] == vocab and cfg["rotary_scaling"] is None
    (emb,) = [v for k, v in load_file(str(tmp_path / "q.qnemo" / "rank0.safetensors")).items() if "vocab_embedding" in k]
    assert torch.equal(emb, hf_tensors(hf)["model.embed_tokens.weight"])
    rep = quantize(str(tmp_path / "m.nemo"), str(tmp_path / "s.qnemo"), algo="none")  # as NeMo runs it
    assert len(rep.warnings) == 1 and "--no-rope-scaling" in rep.warnings[0]
    assert json.loads((tmp_path / "s.qnemo" / "config.json").read_text())["rotary_scaling"]["type"] == "llama3"


def test_inspect_shows_the_true_vocabulary_and_the_padded_rows(tmp_path: Any, cli: Any) -> None:
    hf, vocab = _hf(str(tmp_path / "hf"))
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(hf, nemo, packed=False, layout="legacy", parallel=Parallelism(2, 1))
    cfg = _go_native(nemo)
    div = cfg["make_vocab_size_divisible_by"] * 2
    rows = -(-vocab // div) * div
    assert rows > vocab
    code, out, err = cli("inspect", nemo, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["config"]["vocab_size"] == vocab
    emb = {t["name"]: t["shape"] for t in info["tensors"]}["embedding.word_embeddings.weight"]
    assert emb == [rows, 64]
    assert [n for n in info["notes"] if f"vocab_size {vocab} is the true vocabulary" in n and f"{rows} rows" in n]
    code, out, _ = cli("inspect", nemo)
    assert code == 0 and f"vocab_size: {vocab}" in out and f"{rows}×64" in out
