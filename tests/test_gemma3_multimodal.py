"""Gemma 3's multimodal checkpoints (``Gemma3ForConditionalGeneration``): refused whole, and
with ``--text-only`` their language model imported as a ``Gemma3ForCausalLM`` — from both
spellings of the names, the vision tower and the projector left out in one note — and
exported as a ``Gemma3ForCausalLM`` whose logits are the conditional model's on text."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from nemo_convert import api
from nemo_convert.errors import ConfigError, UnsupportedError

HUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hub_configs", "gemma3")
FOUR_B = "google__gemma-3-4b-it_printed-4.50.3.json"
IDS = torch.tensor([[2, 17, 5, 99, 3, 250, 41, 8, 77, 1, 12]])


def _published() -> dict:
    with open(os.path.join(HUB, FOUR_B)) as f:
        return json.load(f)


def _tiny_config() -> dict:
    """google/gemma-3-4b-it's config shrunk in size only: the same keys, the linear RoPE
    factor, the 5:1 pattern (six layers), a window shorter than the input."""
    hf = _published()
    hf["text_config"].update(hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, vocab_size=300, sliding_window=4,
                             query_pre_attn_scalar=16)
    hf["vision_config"].update(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               image_size=28, patch_size=14)
    hf["mm_tokens_per_image"] = 4
    return hf


def _new_name(name: str) -> str:
    """The names transformers 4.52+ holds in memory (and 4.52-4.5x saved) for the stored
    ``language_model.model.*`` ones that 5.25 writes back (the published checkpoints')."""
    for old, new in (("language_model.model.", "model.language_model."), ("vision_tower.", "model.vision_tower."),
                     ("multi_modal_projector.", "model.multi_modal_projector."), ("language_model.lm_head.", "lm_head.")):
        if name.startswith(old):
            return new + name[len(old):]
    raise AssertionError(name)


@pytest.fixture(scope="module")
def conditional(tmp_path_factory):
    """(model, new-spelling folder, old-spelling folder)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(0)
    hf = _tiny_config()
    model = Gemma3ForConditionalGeneration(Gemma3Config(**{k: v for k, v in hf.items()
                                                           if k not in ("architectures", "transformers_version")}))
    with torch.no_grad():
        for p in model.parameters():  # norms away from their init, so a lost norm shows in the logits
            p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    root = tmp_path_factory.mktemp("gemma3mm")
    old = root / "old"
    model.save_pretrained(old)  # transformers 5.25 writes the stored (4.50) spelling back
    tensors = load_file(str(old / "model.safetensors"))
    assert all(k.startswith(("language_model.model.", "vision_tower.", "multi_modal_projector.")) for k in tensors)
    new = root / "new"
    new.mkdir()
    save_file({_new_name(k): v.contiguous() for k, v in tensors.items()}, str(new / "model.safetensors"),
              metadata={"format": "pt"})
    (new / "config.json").write_text((old / "config.json").read_text())
    return model, new, old


@pytest.mark.slow
def test_refused_by_name_without_the_option(conditional, tmp_path):
    _, new, _ = conditional
    with pytest.raises(UnsupportedError, match="--text-only"):
        api.import_hf(new, tmp_path / "m.nemo")


def test_published_config_reads_as_its_text_config():
    """Every outer key translated, harmless or refused; the text model is the 4B's."""
    from nemo_convert_gemma3.family import GEMMA3

    from nemo_convert.spec import spec_of

    with pytest.raises(UnsupportedError, match="pass --text-only"):
        GEMMA3.config_to_nemo(_published())
    spec = spec_of(GEMMA3.config_to_nemo(_published(), text_only=True))
    g = spec.geometry
    assert (g.layers, g.hidden, g.heads, g.query_groups, g.head_dim, g.ffn, g.vocab_size) == (34, 2560, 8, 4, 256, 10240, 262208)
    assert spec.rope.interpolation == 8.0 and spec.attention.window == 1024
    unknown = {**_published(), "projector_hidden_act": "gelu"}
    with pytest.raises(ConfigError, match="projector_hidden_act"):
        GEMMA3.config_to_nemo(unknown, text_only=True)
    untied = {**_published(), "tie_word_embeddings": False}
    with pytest.raises(UnsupportedError, match="tie_word_embeddings"):
        GEMMA3.config_to_nemo(untied, text_only=True)
    other = copy.deepcopy(_published())
    other["text_config"]["model_type"] = "gemma2"
    with pytest.raises(UnsupportedError, match="gemma3_text"):
        GEMMA3.config_to_nemo(other, text_only=True)


@pytest.mark.slow
def test_text_only_import_and_export_is_the_language_model(conditional, tmp_path):
    """Both spellings import to the same tensors, the tower and projector in one note; export
    writes a Gemma3ForCausalLM with the conditional model's text logits."""
    from transformers import Gemma3ForCausalLM

    model, new, old = conditional
    left = sum(1 for k in load_file(str(new / "model.safetensors")) if "vision_tower" in k or "multi_modal" in k)
    outs = []
    for name, src in (("new", new), ("old", old)):
        rep = api.import_hf(src, tmp_path / f"{name}.nemo", options={"text_only": True})
        at = "model." if name == "new" else ""
        assert [n for n in rep.notes if n.startswith("--text-only")] == [(
            f"--text-only: left out the vision tower and the projector ({at}vision_tower.*, "
            f"{at}multi_modal_projector.*: {left} tensors)")]
        out = tmp_path / f"{name}-hf"
        api.export_hf(tmp_path / f"{name}.nemo", out)
        outs.append(out)
    a, b = ({k: v for f in sorted(o.glob("*.safetensors")) for k, v in load_file(str(f)).items()} for o in outs)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not any(k.startswith(("model.language_model", "model.vision", "language_model")) for k in a)
    cfg = json.loads((outs[0] / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma3ForCausalLM"] and cfg["model_type"] == "gemma3_text"
    assert not {"vision_config", "text_config", "mm_tokens_per_image"} & set(cfg)

    text = Gemma3ForCausalLM.from_pretrained(outs[0]).eval()
    with torch.no_grad():
        want = model(input_ids=IDS).logits
        got = text(input_ids=IDS).logits
        assert torch.equal(got, want), (got - want).abs().max()
        # negative control: one q-norm changed changes the logits
        text.model.layers[0].self_attn.q_norm.weight.add_(0.5)
        assert (text(input_ids=IDS).logits - want).abs().max() > 1e-3
