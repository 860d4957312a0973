"""``ModelFamily.hf.model_class``: the transformers class ``quantize`` calibrates with."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_convert import hookimpl
from nemo_convert.errors import PluginError
from nemo_convert.examples import make_tiny_llama
from nemo_convert.plugins.manager import Registry, registry_with
from nemo_convert.qnemo import quantize
from nemo_convert.qnemo.calibration import hf_model_class

CALIB = {"calib_size": 2, "calib_seq_len": 16, "calib_batch_size": 2}


def _registry_with_class(name: str) -> Registry:
    from nemo_convert_llama.family import LLAMA

    class Custom:
        @hookimpl
        def nemo_convert_model_families(self) -> list[Any]:
            # its own HF names: two families listing LlamaForCausalLM are a registry error
            return [dataclasses.replace(LLAMA, name="custom-llama", hf_architectures=("CustomLlamaForCausalLM",),
                                        hf_model_types=("custom_llama",),
                                        hf=dataclasses.replace(LLAMA.hf, model_class=name))]

    return registry_with(("custom", Custom()))


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_llama(str(tmp_path_factory.mktemp("hfcls") / "llama"), dtype=torch.bfloat16)


def test_declared_classes_exist() -> None:
    from nemo_convert.plugins.manager import get_registry

    for name, fam in get_registry().families.items():
        assert hf_model_class(fam.record.hf.model_class).__name__ == fam.record.hf.model_class, name


def test_calibration_loads_the_family_class(src: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    loaded: list[str] = []

    class RecordingLlama(transformers.LlamaForCausalLM):
        @classmethod
        def from_pretrained(cls, folder: str, *args: Any, **kw: Any) -> Any:  # type: ignore[override]
            loaded.append(folder)
            return super().from_pretrained(folder, *args, **kw)

    monkeypatch.setattr(transformers, "RecordingLlama", RecordingLlama, raising=False)
    quantize(src, str(tmp_path / "x.qnemo"), algo="fp8", family="custom-llama",
             registry=_registry_with_class("RecordingLlama"), **CALIB)
    assert loaded == [src]


def test_unknown_class_is_a_plugin_error(src: str, tmp_path: Path) -> None:
    with pytest.raises(PluginError, match="hf_model_class 'NoSuchModelClass'"):
        quantize(src, str(tmp_path / "x.qnemo"), algo="fp8", family="custom-llama",
                 registry=_registry_with_class("NoSuchModelClass"), **CALIB)
    assert not (tmp_path / "x.qnemo").exists()
