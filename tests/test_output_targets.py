"""Output targets as plugins (issue 23): the ``nemo_convert_targets`` hook, the registry's
``target``/``targets``, and the one output step every conversion writes through — a
third party's target is reached by ``import`` and ``reshard`` with no core edit."""

from __future__ import annotations

import json
import os
import types

import pytest
import torch
from safetensors.torch import load_file, save_file

from nemo_convert import api, hookimpl
from nemo_convert.convert.output import check_output, choose_target, write_output
from nemo_convert.engine import RunStats, run_plan
from nemo_convert.errors import OutputExistsError, PluginError, UnsupportedError
from nemo_convert.plugins.manager import registry_with
from nemo_convert.plugins.records import OutputJob, OutputTarget, QuantSettings
from nemo_convert.workers import Workers


def targets_plugin(*targets: OutputTarget) -> types.SimpleNamespace:
    p = types.SimpleNamespace()

    @hookimpl
    def nemo_convert_targets():
        return list(targets)

    p.nemo_convert_targets = nemo_convert_targets
    return p


def write_flat(job: OutputJob) -> RunStats:
    """A third party's writer: the plan's tensors under their NeMo names in one
    safetensors file, with the config beside it (a tiny model: all in memory)."""
    tensors: dict[str, torch.Tensor] = {}

    def sink(name: str, tensor: torch.Tensor) -> None:
        tensors[name] = tensor.clone()  # the plan's buffers are reused by the next task

    stats = run_plan(job.plan, job.source, sink, progress=job.progress)
    os.makedirs(job.out)
    save_file(tensors, os.path.join(job.out, "model.safetensors"))
    with open(os.path.join(job.out, "config.json"), "w") as f:
        json.dump({"family": job.family.name, "command": job.command, "tp": job.tp,
                   "tokenizer": sorted(job.tokenizer())}, f)
    job.notes.append(f"flat: {len(tensors)} tensors")
    return stats


def _json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


FLAT = OutputTarget("flat", "hf", write_flat, description="the plan's tensors in one safetensors file")


def test_builtin_targets_are_registered_through_the_hook() -> None:
    reg = registry_with()
    assert [t.name for t in reg.targets()][:4] == ["nemo", "megatron-bridge", "hf", "trtllm"]
    assert reg.output_targets["nemo"].plugin == "targets"  # the entry point in pyproject.toml
    assert reg.output_targets["trtllm"].plugin == "trtllm"
    assert reg.target("nemo").options == {"layout", "packed", "workers"}
    assert reg.target("megatron-bridge").options == frozenset()
    assert reg.target("hf").options == {"workers"} and reg.target("hf").kind == "hf"
    trt = reg.target("trtllm")
    assert trt.options == {"packed", "workers", "quantization"} and trt.kind == "qnemo"
    assert trt.is_dir(False) and not trt.is_dir(True)  # a folder, or a tar with --compress
    with pytest.raises(UnsupportedError,
                       match=r"unknown target 'nemo3' \(use nemo, megatron-bridge, hf or trtllm\)"):
        reg.target("nemo3")


@pytest.mark.slow  # a tiny Llama built with transformers, imported and resharded: ~5 s
def test_third_party_target_reached_by_import_and_reshard(tiny_llama, tmp_path) -> None:
    reg = registry_with(("flat-target", targets_plugin(FLAT)))
    assert "flat" in [t.name for t in reg.targets()]
    src = tiny_llama()
    out = str(tmp_path / "flat")
    report = api.import_hf(src, out, to="flat", registry=reg)
    assert report.layout == "flat" and "flat: " in " ".join(report.notes)
    got = load_file(os.path.join(out, "model.safetensors"))
    hf = load_file(os.path.join(src, "model.safetensors"))
    emb = got["embedding.word_embeddings.weight"]
    assert torch.equal(emb, hf["model.embed_tokens.weight"])  # bit-exact, under its NeMo name
    assert torch.equal(got["decoder.final_layernorm.weight"], hf["model.norm.weight"])
    assert len(got) == report.tensors
    meta = _json(os.path.join(out, "config.json"))
    assert meta["family"] == "llama" and meta["command"] == "import" and meta["tokenizer"] == ["tokenizer.model"]
    # the same target from a .nemo: reshard reaches it too
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo, registry=reg)
    out2 = str(tmp_path / "flat2")
    api.reshard(nemo, out2, tp=2, to="flat", registry=reg)
    again = load_file(os.path.join(out2, "model.safetensors"))
    assert again.keys() == got.keys() and all(torch.equal(again[k], got[k]) for k in got)
    assert _json(os.path.join(out2, "config.json"))["tp"] == 2


def test_a_target_refuses_options_it_does_not_take(tmp_path) -> None:
    reg = registry_with(("flat-target", targets_plugin(FLAT)))
    with pytest.raises(UnsupportedError, match=r"--layout legacy is a \.nemo layout; --to flat"):
        choose_target(reg, "flat", layout="legacy")
    with pytest.raises(UnsupportedError, match="--to flat is written by one process"):
        choose_target(reg, "flat", workers=Workers(rank=0, world=2))
    nemo = choose_target(reg, "nemo", layout="legacy", workers=Workers(rank=0, world=2))
    assert nemo.name == "nemo"  # the .nemo target takes both
    with pytest.raises(UnsupportedError,
                       match=r"unknown target 'x' \(use nemo, megatron-bridge, hf, trtllm or flat\)"):
        choose_target(reg, "x")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("x")
    with pytest.raises(OutputExistsError):
        check_output(FLAT, str(taken), overwrite=False)


def test_a_quantizing_target_needs_quantization_settings(tmp_path) -> None:
    """``--to trtllm`` quantizes: a conversion without ``quantize``'s settings is refused it by
    name before the source is opened (the sources here do not exist), and a target that does
    not quantize is refused settings."""
    reg = registry_with(("flat-target", targets_plugin(FLAT)))
    with pytest.raises(UnsupportedError, match=r"--to trtllm quantizes \(a \.qnemo checkpoint\) and needs --algo"):
        choose_target(reg, "trtllm")
    assert choose_target(reg, "trtllm", quantization=QuantSettings("int8_wo"),
                         workers=Workers(rank=0, world=2)).kind == "qnemo"
    with pytest.raises(UnsupportedError, match=r"--to flat writes a Hugging Face checkpoint, which is not quantized"):
        choose_target(reg, "flat", quantization=QuantSettings("int8_wo"))
    missing = str(tmp_path / "missing")
    for convert in (api.reshard, api.import_hf, api.from_ckpt):
        with pytest.raises(UnsupportedError, match="only quantize takes: run nemo-convert quantize"):
            convert(missing, str(tmp_path / "out.qnemo"), to="trtllm", registry=reg)
    assert not os.path.exists(tmp_path / "out.qnemo")


def test_write_output_reports_the_layout_or_the_target_name() -> None:
    seen: list[OutputJob] = []

    def write(job: OutputJob) -> RunStats:
        seen.append(job)
        return RunStats(tensors=3)

    job = OutputJob("import", "out", {}, None, None, None, {}, None, None, layout="dist")  # type: ignore[arg-type]
    takes = OutputTarget("a", "nemo", write, frozenset({"layout"}))
    stats, layout = write_output(takes, job)
    assert (stats.tensors, layout) == (3, "dist") and seen == [job]
    assert write_output(OutputTarget("b", "nemo", write), job)[1] == "b"  # negative control: no layout option
    with pytest.raises(TypeError, match="'c' returned dict"):
        write_output(OutputTarget("c", "nemo", lambda j: {}), job)  # type: ignore[arg-type,return-value]


def test_duplicate_target_names_are_reported() -> None:
    a = targets_plugin(FLAT)
    b = targets_plugin(OutputTarget("flat", "hf", write_flat))
    with pytest.raises(PluginError) as ei:
        registry_with(("plugin-a", a), ("plugin-b", b), entry_points=False)
    msg = str(ei.value)
    assert "OutputTarget 'flat' is provided twice" in msg and "'plugin-a'" in msg and "'plugin-b'" in msg
    with pytest.raises(PluginError, match="'nemo' is provided twice"):  # nor can a built-in be shadowed
        registry_with(("plugin-a", targets_plugin(OutputTarget("nemo", "nemo", write_flat))))


def test_a_target_names_a_known_output_kind() -> None:
    with pytest.raises(PluginError, match="output target 'odd' of plugin 'p'.*kind 'folder'"):
        registry_with(("p", targets_plugin(OutputTarget("odd", "folder", write_flat))), entry_points=False)


def test_the_cli_offers_the_registered_targets(monkeypatch) -> None:
    from nemo_convert.cli import main
    from nemo_convert.cli.cmd_plugins import collect
    from nemo_convert.plugins import manager

    with_flat = registry_with(("flat-target", targets_plugin(FLAT)))
    monkeypatch.setattr(manager, "registry_with", lambda *a, **k: with_flat)
    parser = main.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for command in ("import", "reshard", "from-ckpt"):
        to = next(a for a in sub[command]._actions if a.dest == "to")
        assert to.choices == ["nemo", "megatron-bridge", "hf", "trtllm", "flat"], command
    monkeypatch.setattr(manager, "_REGISTRY", with_flat)
    listed = {t["name"]: t for t in collect()["output_targets"]}
    assert listed["flat"]["plugin"] == "flat-target" and listed["flat"]["kind"] == "hf"
    assert listed["nemo"]["takes"] == ["layout", "packed", "workers"] and listed["megatron-bridge"]["takes"] == []
    assert listed["hf"]["takes"] == ["workers"] and listed["hf"]["kind"] == "hf"
    assert listed["trtllm"]["kind"] == "qnemo" and listed["trtllm"]["plugin"] == "trtllm"


@pytest.mark.slow  # a Lightning checkpoint saved for real (one Adam step), then converted: ~10 s
def test_third_party_target_reached_by_from_ckpt(tiny_llama, tmp_path) -> None:
    import shutil

    from ckpt_builders import CKPT_NAME, lightning_save, nemo_config, nemo_tensors, training_config

    reg = registry_with(("flat-target", targets_plugin(FLAT)))
    src = tiny_llama()
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(src, nemo, layout="legacy", registry=reg)
    want = nemo_tensors(nemo)
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(os.path.join(src, "tokenizer.model"), run / "tokenizer.model")
    ckpt = lightning_save({"model." + k: v for k, v in want.items()}, training_config(nemo_config(nemo)),
                          str(run / CKPT_NAME))
    out = str(tmp_path / "flat")
    report = api.from_ckpt(ckpt, out, to="flat", registry=reg)
    assert report.layout == "flat" and report.tensors == len(want)
    got = load_file(os.path.join(out, "model.safetensors"))
    assert got.keys() == want.keys()
    vocab = report.vocab_size  # the SentencePiece tokenizer's size
    trimmed = {k for k in want if got[k].shape != want[k].shape}  # the legacy .nemo's padding rows are dropped
    assert trimmed == {"embedding.word_embeddings.weight", "output_layer.weight"}
    assert all(got[k].shape[0] == vocab < want[k].shape[0] for k in trimmed)
    assert all(torch.equal(got[k], want[k][: got[k].shape[0]]) for k in want)
    meta = _json(os.path.join(out, "config.json"))
    assert meta["command"] == "from-ckpt" and meta["tokenizer"] == ["tokenizer.model"]


def test_the_built_in_targets_are_named_as_the_writers_know_them():
    """The light registration module (loaded by every command) spells the Megatron-Bridge
    target's name itself; it must be the one the writer and the API use."""
    from nemo_convert.convert import targets
    from nemo_convert.convert.to_megatron_bridge import TARGET, TARGETS

    assert targets.MEGATRON_BRIDGE.name == TARGET
    assert tuple(t.name for t in targets.nemo_convert_targets()) == TARGETS
