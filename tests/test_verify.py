"""``nemo-convert verify`` / :func:`nemo_convert.verify.verify`: HF folders and ``.nemo``
(dist, legacy) compared through the family mapping: tensors, configs, tokenizers (the CLIP
plugin's zero-shot check: ``test_clip_zero_shot.py``). Tiny random models built here;
nothing is downloaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from nemo_convert import api
from nemo_convert.cli.main import main
from nemo_convert.errors import NemoConvertError
from nemo_convert.verify import HFView, compare_tensors, verify
from tiny_models import corpus, make_tiny_llama

K_PROJ = "model.layers.1.self_attn.k_proj.weight"  # fused into linear_qkv in the .nemo


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _edit_hf(src: str, dst: Path, *, tensors: Callable[[dict[str, torch.Tensor]], None] | None = None,
             config: Callable[[dict[str, Any]], None] | None = None) -> str:
    """A copy of the HF folder ``src`` with its weights and/or config.json edited."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if tensors is not None:
        path = dst / "model.safetensors"
        data = {k: v.clone() for k, v in load_file(str(path)).items()}
        tensors(data)
        save_file(data, str(path), metadata={"format": "pt"})
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return str(dst)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("verify")
    hf = make_tiny_llama(str(root / "hf"))
    out = {"hf": hf}
    for layout in ("dist", "legacy"):
        out[layout] = str(root / f"{layout}.nemo")
        api.import_hf(hf, out[layout], layout=layout)
    return out


# -- equal ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["dist", "legacy"])
def test_hf_vs_its_nemo_is_ok(llama: dict[str, str], layout: str, capsys: pytest.CaptureFixture[str]) -> None:
    rep = verify(llama["hf"], llama[layout])
    assert rep.ok and rep.tensors_ok and rep.config_ok and rep.tokenizer_ok
    assert rep.counts() == {"equal": len(rep.tensors)} and len(rep.tensors) == 21
    assert (rep.a.format, rep.b.format, rep.b.layout, rep.b.family) == ("hf", "nemo", layout, "llama")
    assert [e.kind for e in rep.tokenizer.encodings] == ["sentencepiece"]
    code, out, _ = _run(capsys, "verify", llama["hf"], llama[layout])
    assert code == 0 and "OK" in out and "MISMATCH" not in out
    code, out, _ = _run(capsys, "verify", llama[layout], llama["hf"], "--json")
    assert code == 0 and json.loads(out)["ok"] is True


def test_nemo_vs_nemo_across_layouts(llama: dict[str, str], tmp_path: Path) -> None:
    rep = verify(llama["dist"], llama["legacy"])
    assert rep.ok and len(rep.tensors) == 21
    from nemo_convert.convert.nemo_write import Parallelism

    ranks = str(tmp_path / "tp2pp2.nemo")  # per-rank folders, merged on read
    api.import_hf(llama["hf"], ranks, layout="legacy", parallel=Parallelism(tp=2, pp=2))
    rep = verify(ranks, llama["hf"])
    assert rep.ok and len(rep.tensors) == 21


def test_streams_one_task_at_a_time(llama: dict[str, str]) -> None:
    from nemo_convert.convert.common import kinds_for
    from nemo_convert.formats.nemo.nemo import open_nemo
    from nemo_convert.mapping.planner import plan_conversion
    from nemo_convert.plugins.manager import get_registry

    reg = get_registry()
    ck = open_nemo(llama["dist"], strategies=reg.strategies(), providers=reg.providers(), kinds_for=kinds_for(reg))
    try:
        fam = reg.family_for_nemo_config(ck.config)
        view = HFView(ck.source, plan_conversion(fam.mapping(ck.config), ck.config, ck.source, "to_hf"))
        for name in view.names():
            assert tuple(view.load(name).shape) == view.info(name).shape
        assert view.peak_cached == 3  # q, k, v of one split: never more than one task's outputs
        assert not view._cache
    finally:
        ck.close()


# -- tensor differences ------------------------------------------------------------------------


def test_single_flipped_element_is_found(llama: dict[str, str], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    def flip(t: dict[str, torch.Tensor]) -> None:
        t[K_PROJ][3, 5] = -t[K_PROJ][3, 5]

    bad = _edit_hf(llama["hf"], tmp_path / "bad", tensors=flip)
    rep = verify(bad, llama["dist"])
    assert not rep.ok and rep.config_ok and rep.tokenizer_ok
    (diff,) = [t for t in rep.tensors if not t.ok]
    assert (diff.name, diff.status, diff.mismatched, diff.worst_index) == (K_PROJ, "different", 1, [3, 5])
    assert diff.value_a == -diff.value_b and diff.max_abs == pytest.approx(2 * abs(diff.value_b))
    assert rep.worst(1)[0].name == K_PROJ
    code, out, err = _run(capsys, "verify", bad, llama["legacy"])
    assert code == 1 and K_PROJ in out and "MISMATCH" in out and "error" not in err
    code, out, _ = _run(capsys, "verify", bad, llama["legacy"], "--json")
    data = json.loads(out)
    assert code == 1 and data["ok"] is False and data["counts"] == {"equal": 20, "different": 1}
    assert [t["name"] for t in data["tensors"] if t["status"] != "equal"] == [K_PROJ]


def test_tolerance(llama: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def nudge(t: dict[str, torch.Tensor]) -> None:
        t[K_PROJ][0, 0] += 1e-5
        t["model.norm.weight"][7] *= 1 + 1e-4

    near = _edit_hf(llama["hf"], tmp_path / "near", tensors=nudge)
    code, _, _ = _run(capsys, "verify", near, llama["dist"], "-q")
    assert code == 1
    code, out, _ = _run(capsys, "verify", near, llama["dist"], "--atol", "1e-3", "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] and data["counts"] == {"equal": 19, "close": 2}
    close = {t["name"]: t for t in data["tensors"] if t["status"] == "close"}
    assert close[K_PROJ]["max_abs"] == pytest.approx(1e-5, rel=1e-2) and close[K_PROJ]["mismatched"] == 0
    assert _run(capsys, "verify", near, llama["dist"], "--atol", "1e-6", "-q")[0] == 1
    assert _run(capsys, "verify", near, llama["dist"], "--rtol", "1e-2", "-q")[0] == 0


def test_dtype_mismatch(llama: dict[str, str], tmp_path: Path) -> None:
    bf16 = str(tmp_path / "bf16.nemo")
    api.import_hf(llama["hf"], bf16, dtype="bf16")
    rep = verify(llama["hf"], bf16, atol=1.0)
    assert not rep.tensors_ok and {t.status for t in rep.tensors} == {"dtype"}
    assert rep.tensors[0].dtype_a == "float32" and rep.tensors[0].dtype_b == "bfloat16"
    assert [c.path for c in rep.config] == ["dtype"]


def test_missing_and_tied_tensors(tmp_path: Path) -> None:
    hf = make_tiny_llama(str(tmp_path / "tied"), tie_word_embeddings=True)
    nemo = str(tmp_path / "tied.nemo")
    api.import_hf(hf, nemo)

    def add_head(t: dict[str, torch.Tensor]) -> None:
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()

    with_head = _edit_hf(hf, tmp_path / "with_head", tensors=add_head)
    rep = verify(with_head, nemo)
    assert rep.ok
    (head,) = [t for t in rep.tensors if t.name == "lm_head.weight"]
    assert head.status == "equal" and "tied" in (head.note or "")

    def drop(t: dict[str, torch.Tensor]) -> None:
        del t["model.norm.weight"]

    rep = verify(_edit_hf(hf, tmp_path / "no_norm", tensors=drop), nemo)
    assert [(t.name, t.status) for t in rep.tensors if not t.ok] == [("model.norm.weight", "missing_a")]


def test_compare_tensors_edge_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    import nemo_convert.verify.tensors as vt

    monkeypatch.setattr(vt, "CHUNK", 1000)
    nan, inf = float("nan"), float("inf")
    a = torch.tensor([1.0, nan, inf, -0.0, 2.0])
    assert compare_tensors("x", a, a.clone()).status == "equal"
    b = torch.tensor([1.0, nan, inf, 0.0, 2.0])
    d = compare_tensors("x", a, b)
    assert (d.status, d.max_abs, d.mismatched) == ("close", 0.0, 0)  # -0.0 vs 0.0: equal numbers, other bits
    d = compare_tensors("x", a, torch.tensor([1.0, 0.0, inf, 0.0, 2.0]))
    assert d.status == "different" and d.max_abs == inf and d.worst_index == [1]
    d = compare_tensors("x", torch.tensor([0.5]), torch.tensor([0.0]))
    assert d.max_rel == inf and d.max_abs == 0.5
    assert compare_tensors("x", torch.zeros(2, 3), torch.zeros(3, 2)).status == "shape"
    assert compare_tensors("x", torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int32)).status == "dtype"
    big = torch.randn(3, 2000)
    other = big.clone()
    other[2, 1234] += 1
    other[0, 5] += 0.25
    d = compare_tensors("big", big, other, atol=0.5)
    assert (d.status, d.mismatched, d.worst_index) == ("different", 1, [2, 1234])  # found across chunks


# -- config and tokenizer differences -----------------------------------------------------------


def test_config_change_reported_with_key_path(llama: dict[str, str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    def change(cfg: dict[str, Any]) -> None:
        cfg["rms_norm_eps"] = 1e-6
        cfg["rope_parameters"]["rope_theta"] = 5e5
        cfg["extra_field"] = {"x": 1}

    other = _edit_hf(llama["hf"], tmp_path / "cfg", config=change)
    rep = verify(other, llama["dist"])
    assert rep.tensors_ok and rep.tokenizer_ok and not rep.ok
    assert [(c.path, c.kind, c.a, c.b) for c in rep.config] == [
        ("rms_norm_eps", "changed", 1e-6, 1e-5), ("rope_parameters.rope_theta", "changed", 5e5, 1e4),
        ("extra_field", "missing_b", {"x": 1}, None)]
    code, out, _ = _run(capsys, "verify", other, llama["dist"])
    assert code == 1 and "rms_norm_eps" in out and "rope_parameters.rope_theta" in out
    code, out, _ = _run(capsys, "verify", other, llama["dist"], "--json")
    assert {c["path"] for c in json.loads(out)["config"]} == {"rms_norm_eps", "rope_parameters.rope_theta",
                                                                "extra_field"}


def test_patched_tokenizer_reported(llama: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nemo_convert.convert.tokenizer_patch import add_tokens

    patched = str(tmp_path / "patched.nemo")
    add_tokens(llama["dist"], patched, ["<image>", "<extra_id_0>"])
    rep = verify(llama["hf"], patched)
    assert rep.tensors_ok and rep.config_ok and not rep.tokenizer_ok and not rep.ok
    assert [(f.name, f.status) for f in rep.tokenizer.files] == [("tokenizer.model", "different")]
    (enc,) = rep.tokenizer.encodings
    assert (enc.kind, enc.vocab_size_a, enc.vocab_size_b) == ("sentencepiece", 300, 302)
    assert enc.only_a == [] and enc.only_b == ["<extra_id_0>", "<image>"]
    examples = {ex["text"]: ex for ex in enc.examples}
    assert enc.differing == 6 and {"<image>", "<extra_id_0>"} <= set(examples)
    assert 300 in examples["<image>"]["b"] and 300 not in examples["<image>"]["a"]
    code, out, _ = _run(capsys, "verify", llama["hf"], patched)
    assert code == 1 and "vocab 300 vs 302" in out
    # The same tokenizer patched the same way on both sides: equal again.
    patched2 = str(tmp_path / "patched2.nemo")
    add_tokens(llama["legacy"], patched2, ["<image>", "<extra_id_0>"])
    assert verify(patched, patched2).ok


def test_hf_tokenizer_json_compared(tmp_path: Path) -> None:
    from nemo_convert.verify import compare_tokenizers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>"],
                                                          show_progress=False))
    a = tok.to_str().encode()
    data = json.loads(a)
    assert compare_tokenizers({"tokenizer.json": a}, {"tokenizer.json": json.dumps(data, indent=4).encode()}).ok
    data["added_tokens"].append({"id": 120, "content": "<image>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    rep = compare_tokenizers({"tokenizer.json": a}, {"tokenizer.json": json.dumps(data).encode()})
    assert not rep.ok and rep.files[0].diffs[0].path == "added_tokens"
    (enc,) = rep.encodings
    assert (enc.kind, enc.vocab_size_a, enc.vocab_size_b, enc.only_b) == ("hf", 120, 121, ["<image>"])


# -- bad input ----------------------------------------------------------------------------------


def test_bad_input_exit_2(llama: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["verify", llama["hf"], str(tmp_path / "nope")],
                 ["verify", llama["hf"], llama["dist"], "--atol", "-1"],
                 ["verify", llama["hf"], llama["dist"], "--texts", "a dog"],
                 ["verify", llama["hf"], llama["dist"], "--family", "nosuchfamily"]):
        code, _, err = _run(capsys, *argv)
        assert code == 2 and err.startswith("nemo-convert: error:") and err.count("\n") == 1, (argv, err)
    junk = tmp_path / "junk.nemo"
    junk.write_bytes(b"no tar here")
    assert _run(capsys, "verify", str(junk), llama["dist"])[0] == 2
    with pytest.raises(NemoConvertError):
        verify(llama["hf"], llama["dist"], options={"clip_image": str(tmp_path / "missing.png"), "texts": ["x"]})


# -- RoPE per layer kind: transformers 4's and 5's spellings ---------------------------------------

_GEMMA3_4B = Path(__file__).parent / "data" / "hub_configs" / "gemma3" / "google__gemma-3-4b-it_printed-4.50.3.json"


def _gemma3_both_spellings() -> tuple[dict[str, Any], dict[str, Any]]:
    """google/gemma-3-4b-it's text config as published (``rope_theta``, ``rope_local_base_freq``,
    a linear ``rope_scaling``), and the same with the RoPE spelled as transformers 5's
    ``Gemma3TextConfig`` writes it (one block per layer kind: :func:`test_transformers_writes_per_kind_ropes`)."""
    old = {**json.loads(_GEMMA3_4B.read_text())["text_config"], "architectures": ["Gemma3ForCausalLM"]}
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling")}
    new["rope_parameters"] = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                              "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}
    return old, new


def test_rope_per_layer_kind_compared_by_meaning() -> None:
    from nemo_convert.verify.configs import compare_hf_configs

    old, new = _gemma3_both_spellings()
    assert compare_hf_configs(old, new) == ([], []) and compare_hf_configs(new, old) == ([], [])
    # negative controls, a change in either spelling, on either layer kind, is still reported
    changed = [({**old, "rope_local_base_freq": 20000.0}, new, "rope_theta[sliding_attention]", 20000.0, 10000.0),
               (old, {**new, "rope_parameters": {**new["rope_parameters"], "sliding_attention": {
                   "rope_type": "default", "rope_theta": 5000.0}}}, "rope_theta[sliding_attention]", 10000.0, 5000.0),
               ({**old, "rope_scaling": None}, new, "rope_scaling[full_attention]", None,
                {"rope_type": "linear", "factor": 8.0}),
               ({**old, "rope_theta": 5e5}, new, "rope_theta[full_attention]", 5e5, 1e6)]
    for a, b, path, va, vb in changed:
        diffs, _ = compare_hf_configs(a, b)
        assert [(d.path, d.a, d.b) for d in diffs] == [(path, va, vb)], diffs
    # per-kind blocks without their bases, the bases in the older keys (what the conversion's
    # setdefault fills; a spelling seen in configs written between the two)
    between = {**new, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0}, "sliding_attention": {"rope_type": "default"}}}
    assert compare_hf_configs(old, between) == ([], []) and compare_hf_configs(between, new) == ([], [])
    diffs, _ = compare_hf_configs(old, {**between, "rope_local_base_freq": 1e5})
    assert [(d.path, d.a, d.b) for d in diffs] == [("rope_theta[sliding_attention]", 1e4, 1e5)]
    # one RoPE for every layer is that RoPE on each layer kind of the other side
    one = {k: v for k, v in new.items() if k != "rope_parameters"}
    same = {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    kinds = {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    assert compare_hf_configs({**one, "rope_theta": 1e4}, {**one, **kinds}) == ([], [])
    assert compare_hf_configs({**one, **same}, {**one, **kinds}) == ([], [])
    diffs, _ = compare_hf_configs({**one, "rope_theta": 1e4}, new)
    assert [d.path for d in diffs] == ["rope_theta[full_attention]", "rope_scaling[full_attention]"]


@pytest.mark.slow
def test_transformers_writes_per_kind_ropes() -> None:
    """The installed transformers reads the published spelling and writes the per-kind one;
    the two verify equal (imports transformers: slow)."""
    from transformers import Gemma3TextConfig

    from nemo_convert.verify.configs import compare_hf_configs

    old, new = _gemma3_both_spellings()
    written = Gemma3TextConfig(**old).to_dict()
    assert written["rope_parameters"] == new["rope_parameters"]
    assert not {"rope_theta", "rope_local_base_freq", "rope_scaling"} & {k for k, v in written.items() if v is not None}
    assert compare_hf_configs(old, {**new, "rope_parameters": written["rope_parameters"]}) == ([], [])


# -- keys one side writes and transformers reads alike on both -------------------------------------

_HUB = Path(__file__).parent / "data" / "hub_configs"


def _published(name: str) -> dict[str, Any]:
    cfg = json.loads((_HUB / name).read_text())
    return {**cfg["text_config"], "architectures": ["Gemma3ForCausalLM"]} if "text_config" in cfg else cfg


def _resaved(cfg: dict[str, Any]) -> dict[str, Any]:
    """What the installed transformers (5.x) writes for ``cfg`` (``save_pretrained``'s
    ``config.json`` is ``to_dict``): its own defaults, derived keys and spellings added."""
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[cfg["model_type"]].from_dict(dict(cfg)).to_dict()


def test_one_sided_key_without_a_config_class_is_reported() -> None:
    """No ``model_type`` (no transformers class to read it): a key on one side only stays a
    difference (no transformers import: fast)."""
    from nemo_convert.verify.configs import compare_hf_configs

    diffs, notes = compare_hf_configs({"hidden_size": 8}, {"hidden_size": 8, "use_bidirectional_attention": False})
    assert [(d.path, d.kind) for d in diffs] == [("use_bidirectional_attention", "missing_a")] and notes == []


_RESAVED = ["gemma3/google__gemma-3-4b-it_printed-4.50.3.json", "gemma3/google__gemma-3-1b-it_saved-4.52.4.json",
            "gemma3/google__gemma-3-270m.json", "llama/meta-llama__Llama-3.1-8B.json",
            "llama/meta-llama__Llama-2-7b-chat-hf.json", "qwen2/Qwen__Qwen2.5-7B.json"]


@pytest.mark.slow
@pytest.mark.parametrize("name", _RESAVED)
def test_transformers_5_save_verifies_against_the_published_config(name: str) -> None:
    """A published ``config.json`` (what ``export`` writes for it: ``test_hub_configs``) against
    the same config saved by transformers 5 (``to_dict``: ``_sliding_window_pattern``,
    ``use_bidirectional_attention``, ``layer_types``, the token ids, ``attention_bias`` …): the
    keys only one side writes are read by transformers alike and are one note; only
    ``transformers_version`` is left (imports transformers: slow)."""
    from nemo_convert.verify.configs import compare_hf_configs

    published = _published(name)
    resaved = _resaved(published)
    spellings = [published]
    if "rope_local_base_freq" in published:  # Gemma 3 in transformers 5's RoPE spelling too
        spellings.append({**{k: v for k, v in published.items()
                             if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling")},
                          "rope_parameters": resaved["rope_parameters"]})
    for cfg in spellings:
        for a, b in ((cfg, resaved), (resaved, cfg)):
            diffs, notes = compare_hf_configs(a, b)
            assert [d.path for d in diffs] == ["transformers_version"], diffs
            assert len(notes) == 1 and "read alike by transformers'" in notes[0], notes
            added = set(resaved) - set(cfg) - {"transformers_version", "rope_parameters", "dtype"}
            assert added and all(f"{k}," in notes[0] or f"{k} written" in notes[0] for k in added), (added, notes)


@pytest.mark.slow
def test_keys_transformers_reads_otherwise_are_still_reported() -> None:
    """Negative controls: what the class reads differently on the two sides stays a difference
    (imports transformers: slow)."""
    from nemo_convert.verify.configs import compare_hf_configs

    def paths(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, str]]:
        return [(d.path, d.kind) for d in compare_hf_configs(a, b)[0] if d.path != "transformers_version"]

    gemma = _published("gemma3/google__gemma-3-4b-it_printed-4.50.3.json")
    saved = _resaved(gemma)
    assert paths(gemma, {**saved, "sliding_window": 512}) == [("sliding_window", "changed")]
    assert paths(gemma, {**saved, "use_bidirectional_attention": True}) == [("use_bidirectional_attention",
                                                                             "missing_a")]
    assert paths(gemma, {**saved, "bos_token_id": 7}) == [("bos_token_id", "missing_a")]
    assert paths(gemma, {**saved, "eos_token_id": [1, 106]}) == [("eos_token_id", "missing_a")]
    assert paths({k: v for k, v in gemma.items() if k != "final_logit_softcapping"}, saved) == []  # the class's None
    assert paths(gemma, {**saved, "cache_implementation": None}) == [("cache_implementation", "changed")]  # stored
    assert paths(gemma, {**saved, "some_new_flag": False}) == [("some_new_flag", "missing_a")]  # stored, not read
    # an older spelling: sliding_window_pattern 6 is the class's own pattern, 4 is another
    bare = {k: v for k, v in gemma.items() if k != "sliding_window_pattern"}
    assert paths(bare, gemma) == [] and paths(gemma, bare) == []
    assert paths(bare, {**gemma, "sliding_window_pattern": 4}) == [("sliding_window_pattern", "missing_a")]
    # a private record the class derives and never reads back (transformers 5's beside layer_types):
    # inert at any value; a private key the class does not derive is a difference
    assert paths(saved, {**saved, "_sliding_window_pattern": 4}) == []
    assert paths({k: v for k, v in saved.items() if k != "_sliding_window_pattern"},
                 {**saved, "_sliding_window_pattern": 2}) == []
    assert paths(saved, {**saved, "_not_a_config_field": 2}) == [("_not_a_config_field", "missing_a")]
    # but the public pattern without layer_types is read: a layer_types it implies otherwise is reported
    assert paths({**bare, "layer_types": saved["layer_types"]}, {**bare, "sliding_window_pattern": 4}) == [
        ("layer_types", "missing_b"), ("sliding_window_pattern", "missing_a")]
    # Llama: a token id absent on one side reads as the class's 1, not the published one
    llama = _published("llama/meta-llama__Llama-3.1-8B.json")
    lsaved = _resaved(llama)
    assert paths(llama, {k: v for k, v in lsaved.items() if k != "bos_token_id"}) == [("bos_token_id", "missing_b")]
    assert paths(llama, {**lsaved, "attention_bias": True}) == [("attention_bias", "changed")]
    llama2 = _published("llama/meta-llama__Llama-2-7b-chat-hf.json")  # published without attention_bias
    assert "attention_bias" not in llama2 and paths(llama2, _resaved(llama2)) == []
    assert paths(llama2, {**_resaved(llama2), "attention_bias": True}) == [("attention_bias", "missing_a")]
    # Qwen2: a window stated two ways reads as None while use_sliding_window is false; not once it is true
    qwen = _published("qwen2/Qwen__Qwen2.5-7B.json")
    assert qwen["use_sliding_window"] is False and qwen["sliding_window"] is not None
    assert paths(qwen, {**qwen, "sliding_window": 4096}) == []
    on = {**qwen, "use_sliding_window": True}
    assert paths(on, {**on, "sliding_window": 4096}) == [("sliding_window", "changed")]
