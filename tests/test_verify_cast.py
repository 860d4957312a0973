"""``verify --allow-dtype-change``: a checkpoint exported with a dtype cast, compared by
value (both sides upcast, then ``atol``/``rtol``); without the flag a dtype change is a
difference whatever the tolerance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_convert import api
from nemo_convert.cli.main import main
from nemo_convert.examples import make_tiny_llama
from nemo_convert.verify import compare_tensors, verify

#: bf16's machine epsilon: rounding an fp32 value to bf16 moves it by at most half of it.
BF16_RTOL = 2.0 ** -7


@pytest.fixture(scope="module")
def cast(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An fp32 HF model, its bf16 import, and that import exported back as fp32."""
    base = tmp_path_factory.mktemp("cast")
    hf = make_tiny_llama(str(base / "hf"), tokenizer=False)
    bf16 = str(base / "bf16.nemo")
    api.import_hf(hf, bf16, dtype="bf16")
    back = str(base / "back-fp32")
    api.export_hf(bf16, back, dtype="fp32")
    return {"hf": hf, "bf16": bf16, "back": back}


def test_without_the_flag_a_cast_is_a_mismatch(cast: dict[str, str]) -> None:
    rep = verify(cast["hf"], cast["bf16"], atol=1.0)
    assert not rep.ok and {t.status for t in rep.tensors} == {"dtype"}
    assert [c.path for c in rep.config] == ["dtype"]
    assert not rep.allow_dtype_change and rep.as_dict()["allow_dtype_change"] is False


def test_downcast_within_tolerance_matches(cast: dict[str, str]) -> None:
    rep = verify(cast["hf"], cast["bf16"], rtol=BF16_RTOL, allow_dtype_change=True)
    assert rep.ok, rep.as_dict()
    assert {t.status for t in rep.tensors} == {"close"} and rep.config == []
    t = rep.tensors[0]
    assert (t.dtype_a, t.dtype_b) == ("float32", "bfloat16") and t.mismatched == 0
    assert 0 < t.max_rel <= BF16_RTOL / 2  # type: ignore[operator]
    assert t.note == "dtype changed (float32 → bfloat16); compared by value"
    assert rep.notes == [
        (f"{len(rep.tensors)} tensor(s) changed dtype (float32 in A, bfloat16 in B); compared by value "
         "(allow_dtype_change)"),
        "config dtype: float32 in A, bfloat16 in B (allow_dtype_change)"]
    assert rep.as_dict()["allow_dtype_change"] is True


def test_tolerance_still_applies(cast: dict[str, str]) -> None:
    rep = verify(cast["hf"], cast["bf16"], allow_dtype_change=True)  # exact: the rounding shows
    assert not rep.ok and {t.status for t in rep.tensors} == {"different"}
    assert all(t.dtype_b == "bfloat16" and t.note for t in rep.tensors)


def test_lossless_upcast_matches_exactly(cast: dict[str, str]) -> None:
    assert not verify(cast["bf16"], cast["back"]).ok
    rep = verify(cast["bf16"], cast["back"], allow_dtype_change=True)
    assert rep.ok and all(t.status == "close" and t.max_abs == 0 for t in rep.tensors)
    assert {(t.dtype_a, t.dtype_b) for t in rep.tensors} == {("bfloat16", "float32")}


def test_other_config_differences_still_count(cast: dict[str, str], tmp_path: Path) -> None:
    import shutil

    edited = tmp_path / "edited"
    shutil.copytree(cast["back"], edited)
    cfg = json.loads((edited / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-3
    (edited / "config.json").write_text(json.dumps(cfg))
    rep = verify(cast["bf16"], str(edited), allow_dtype_change=True)
    assert rep.tensors_ok and not rep.ok and [c.path for c in rep.config] == ["rms_norm_eps"]


def test_only_floating_dtypes_are_compared_by_value() -> None:
    ints = compare_tensors("x", torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int32),
                           allow_dtype_change=True)
    mixed = compare_tensors("x", torch.zeros(3), torch.zeros(3, dtype=torch.int32), allow_dtype_change=True)
    assert ints.status == mixed.status == "dtype"
    half = compare_tensors("x", torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.5], dtype=torch.float16),
                           allow_dtype_change=True)
    assert half.status == "close" and half.max_abs == 0


def test_cli_flag(cast: dict[str, str], capsys: Any) -> None:
    argv = ["verify", cast["hf"], cast["bf16"], "--rtol", str(BF16_RTOL)]
    assert main([*argv, "-q"]) == 1
    assert main([*argv, "--allow-dtype-change", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["allow_dtype_change"] is True and set(data["counts"]) == {"close"}
    assert main([*argv, "--allow-dtype-change"]) == 0
    out = capsys.readouterr().out
    assert "dtype changes allowed" in out and "float32 / bfloat16" in out and "OK: the checkpoints match" in out
