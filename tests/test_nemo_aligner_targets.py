"""``.nemo`` files of NeMo's SFT and NeMo-Aligner: their trainer classes as ``target``
(one core table, :mod:`nemo_convert.formats.nemo.nemo_targets`), and the reward models'
``rm_head`` — refused by name (no HF class holds a score head with bias), or left out with
``--drop-head`` so the language model is written.

The reward-model fixture is what NeMo-Aligner saves (``nemo_aligner/models/nlp/gpt/
gpt_reward_model.py``: ``rm_head`` a ``RowParallelLinear(hidden, num_attributes, bias=True)``
beside the untied ``output_layer``; ``megatron_gpt_reward_model.py`` lines 87-91,
109: ``regression.num_attributes``), in Megatron-Core's dist layout.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
import torch
import yaml

from ckpt_builders import _stack
from nemo_convert import api
from nemo_convert.formats.nemo.nemo_targets import GPT_TARGET, GPT_TARGET_ALIASES, REWARD_TARGETS
from nemo_convert.plugins.manager import get_registry
from tiny_models import hf_tensors, read_json

ALIGNER = "nemo_aligner.models.nlp.gpt."
ACTOR = ALIGNER + "megatron_gpt_reinforce_actor.MegatronGPTReinforceActorModel"
REGRESSION_RM = ALIGNER + "megatron_gpt_regression_reward_model.MegatronGPTRegressionRewardModel"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: Any) -> dict[str, Any]:
    from nemo_convert.examples import make_tiny_llama

    root = tmp_path_factory.mktemp("aligner")
    src = make_tiny_llama(str(root / "hf"), vocab_size=300)  # its tokenizer's size (NeMo pads the rows)
    nemo = str(root / "m")
    api.import_hf(src, nemo, packed=False)  # the unpacked folder form of a .nemo
    with api.open_checkpoint(nemo) as ck:
        logical = {k: ck.source.load(k).clone() for k in ck.source.keys()}
    return {"src": src, "nemo": nemo, "logical": logical, "root": root}


def _aligner_nemo(llama: dict[str, Any], out: str, target: str, *, head: int | None = None,
                  **cfg_over: Any) -> str:
    """The .nemo folder with ``target`` (and a ``head``-attribute reward head) as NeMo-Aligner
    saves it: config without our record, weights in the dist layout."""
    from nemo_convert.formats.dist_checkpoint.distckpt_write import DistCheckpointWriter, write_dist_metadata
    from nemo_convert.formats.io.sink import DirectorySink

    shutil.copytree(llama["nemo"], out)
    with open(os.path.join(out, "model_config.yaml")) as f:
        cfg = yaml.safe_load(f)
    section = cfg.pop("nemo_convert")
    cfg.update(target=target, override_vocab_size=section["vocab_size"], **cfg_over)
    if head is not None:
        cfg["regression"] = {"num_attributes": head, "merge_attributes": False}
    with open(os.path.join(out, "model_config.yaml"), "w") as f:
        yaml.safe_dump(cfg, f)
    logical = dict(llama["logical"])
    if head is not None:
        g = torch.Generator().manual_seed(3)
        logical["rm_head.weight"] = torch.randn(head, 64, generator=g)
        logical["rm_head.bias"] = torch.randn(head, generator=g)
    shutil.rmtree(os.path.join(out, "model_weights"))
    sink = DirectorySink(os.path.join(out, "model_weights"))
    w = DistCheckpointWriter(sink, "")
    for key, pieces in _stack(logical).items():
        layered = pieces[0][0] is not None
        w.declare(key, ((len(pieces),) if layered else ()) + tuple(pieces[0][1].shape), pieces[0][1].dtype)
        for i, t in pieces:
            w.write_chunk(key, [i] + [0] * t.dim() if layered else [0] * t.dim(), t.unsqueeze(0) if layered else t)
    write_dist_metadata(sink, "", [w.close(finalize=False)])
    torch.save({}, os.path.join(out, "model_weights", "common.pt"))
    return out


@pytest.mark.parametrize("target", sorted(GPT_TARGET_ALIASES))
def test_every_aliased_target_is_a_gpt_model(target: str) -> None:
    cfg = {"target": target, "normalization": "rmsnorm", "activation": "fast-swiglu", "position_embedding_type": "rope",
           "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
           "num_query_groups": 4, "max_position_embeddings": 128, "bias": False,
           "share_embeddings_and_output_weights": False}
    want = get_registry().family_for_nemo_config({**cfg, "target": GPT_TARGET})
    assert get_registry().family_for_nemo_config(cfg) is want


def test_aligner_actor_exports(llama: dict[str, Any], tmp_path: Any, cli: Any) -> None:
    """Llama-3.1-Nemotron-70B-Instruct's case: a REINFORCE actor's .nemo exports as its GPT family."""
    nemo = _aligner_nemo(llama, str(tmp_path / "actor"), ACTOR)
    code, _, err = cli("export", nemo, "-o", str(tmp_path / "hf"), "-q")
    assert code == 0, err
    a, b = hf_tensors(llama["src"]), hf_tensors(str(tmp_path / "hf"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("target", REWARD_TARGETS)
def test_reward_model_is_refused_by_name(llama: dict[str, Any], tmp_path: Any, cli: Any, target: str) -> None:
    nemo = _aligner_nemo(llama, str(tmp_path / "rm"), target, head=9)
    code, _, err = cli("export", nemo, "-o", str(tmp_path / "never"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "reward head (rm_head.weight [9, 64] + rm_head.bias [9])" in err and "--drop-head" in err
    assert not os.path.exists(tmp_path / "never")
    code, out, err = cli("verify", llama["src"], nemo)
    assert code == 2 and "--drop-head" in err


def test_reward_model_with_drop_head_writes_the_language_model(llama: dict[str, Any], tmp_path: Any,
                                                               cli: Any) -> None:
    """Llama3-70B-SteerLM-RM's case (9 attributes); its config says tied, as NeMo's Llama
    yaml may, but the reward model always builds an untied output layer."""
    nemo = _aligner_nemo(llama, str(tmp_path / "rm"), REGRESSION_RM, head=9,
                         share_embeddings_and_output_weights=True)
    code, _, err = cli("export", nemo, "-o", str(tmp_path / "hf"), "--drop-head")
    assert code == 0, err
    notes = [ln for ln in err.splitlines() if "reward head" in ln]
    assert len(notes) == 1 and "left out the reward head (rm_head.weight [9, 64] + rm_head.bias [9]" in notes[0]
    a, b = hf_tensors(llama["src"]), hf_tensors(str(tmp_path / "hf"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert read_json(str(tmp_path / "hf/config.json"))["tie_word_embeddings"] is False
    rep = api.verify(llama["src"], nemo, drop_head=True)
    assert rep.ok, rep.as_dict()
