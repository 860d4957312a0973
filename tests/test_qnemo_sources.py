"""``quantize`` reads every checkpoint that holds a model, as ``reshard`` and ``export`` do:
a Megatron-Bridge directory and a Megatron-LM run (``--iteration`` as ``reshard`` takes it)
quantized directly give the very ``.qnemo`` (every file, byte for byte) that ``reshard`` to a
``.nemo`` and ``quantize`` of that give, calibration included (a temporary HF export of the
source). A ``.qnemo`` and a training checkpoint are refused by name, before anything is read
or written."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest
import yaml
from test_megatron_dirs import as_megatron_lm, megatron_lm_args
from tiny_models import make_tiny_llama, write_sentencepiece

from nemo_convert import api
from nemo_convert.errors import InputError
from nemo_convert.qnemo import quantize

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CALIB = {"calib_size": 2, "calib_seq_len": 16, "calib_batch_size": 2}


def file_hashes(folder: str) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder``."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


def direct_and_via_nemo(src: str, root: str, algo: str, tp: int, **kw) -> tuple[dict[str, str], dict[str, str]]:  # type: ignore[no-untyped-def]
    """The file hashes of ``quantize(src)`` and of ``quantize(reshard(src) → .nemo)``."""
    iteration = kw.pop("iteration", None)
    tag = f"{os.path.basename(src)}-{algo}-tp{tp}-{iteration}"
    nemo = os.path.join(root, f"{tag}.nemo")
    api.reshard(src, nemo, iteration=iteration)
    dtype = None if algo == "none" else "bf16"
    direct, via = os.path.join(root, f"{tag}-direct"), os.path.join(root, f"{tag}-via")
    quantize(src, direct, algo=algo, tp=tp, dtype=dtype, iteration=iteration, **CALIB, **kw)
    quantize(nemo, via, algo=algo, tp=tp, dtype=dtype, **CALIB, **kw)
    return file_hashes(direct), file_hashes(via)


@pytest.fixture(scope="module")
def llama_dirs(tmp_path_factory) -> dict[str, str]:
    """A tiny Llama as a Megatron-Bridge directory (its tokenizer in ``tokenizer/``) and as a
    Megatron-LM run (``common.pt`` args, no tokenizer)."""
    root = tmp_path_factory.mktemp("llama")
    src = make_tiny_llama(str(root / "hf"))
    mb = str(root / "mb")
    api.import_hf(src, mb, to="megatron-bridge")
    mlm = as_megatron_lm(mb, str(root / "mlm"), megatron_lm_args(padded_vocab_size=320))
    return {"hf": src, "mb": mb, "mlm": mlm}


@pytest.mark.slow
@pytest.mark.parametrize("kind, algo, tp", [
    ("mb", "none", 1), ("mb", "int8_wo", 2), ("mb", "fp8", 1),  # fp8 calibrates on the source's HF export
    ("mlm", "none", 1), ("mlm", "int8_wo", 1),
])
def test_megatron_dirs_quantize_as_their_nemo(llama_dirs, tmp_path, kind, algo, tp) -> None:
    direct, via = direct_and_via_nemo(llama_dirs[kind], str(tmp_path), algo, tp)
    assert direct == via
    ranks = sorted(n for n in direct if n.startswith("rank"))
    assert ranks == [f"rank{r}.safetensors" for r in range(tp)]
    if kind == "mb":  # the tokenizer the directory carries, as the .nemo carries it
        assert {"tokenizer.model", "tokenizer_config.yaml"} <= set(direct)
    # a negative control: another algorithm's output differs
    if algo != "none":
        other, _ = direct_and_via_nemo(llama_dirs[kind], str(tmp_path / "none"), "none", tp)
        assert other["rank0.safetensors"] != direct["rank0.safetensors"]


@pytest.mark.slow
def test_nemo2_folder_quantizes_as_its_nemo(llama_dirs, tmp_path) -> None:
    """A NeMo 2 folder (quantize read it before): also the bytes of its ``.nemo``'s ``.qnemo``,
    its SentencePiece model named in ``tokenizer_config.yaml`` as the ``.nemo`` names it."""
    from test_parallelism import _write_nemo2

    nemo = str(tmp_path / "m.nemo")
    api.import_hf(llama_dirs["hf"], nemo)
    folder = str(tmp_path / "nemo2")
    _write_nemo2(folder, nemo)
    direct, via = direct_and_via_nemo(folder, str(tmp_path), "int8_wo", 2)
    assert direct == via and "tokenizer_config.yaml" in direct


@pytest.mark.slow
def test_mb_tokenizer_section_is_the_nemo_one(llama_dirs, tmp_path) -> None:
    """The directory's SentencePiece model is named in ``tokenizer_config.yaml`` as NeMo's
    loader opens it (``model: tokenizer.model``), the file copied beside it."""
    out = str(tmp_path / "q")
    quantize(llama_dirs["mb"], out, algo="none")
    with open(os.path.join(out, "tokenizer_config.yaml")) as f:
        section = yaml.safe_load(f)
    assert section["library"] == "sentencepiece" and section["model"] == "tokenizer.model"
    with open(os.path.join(out, "tokenizer.model"), "rb") as a, \
            open(os.path.join(llama_dirs["hf"], "tokenizer.model"), "rb") as b:
        assert a.read() == b.read()


@pytest.mark.slow
def test_several_iterations_as_reshard_reads_them(tmp_path, cli) -> None:
    """A run with two iterations: without ``--iteration`` the tracker's is quantized (as
    ``reshard`` reads it), ``--iteration 50`` the other; each the same bytes as its ``.nemo``;
    a tracker naming a missing folder is one line and nothing written."""
    a = make_tiny_llama(str(tmp_path / "a"), seed=1)
    b = make_tiny_llama(str(tmp_path / "b"), seed=2)
    api.import_hf(a, str(tmp_path / "mba"), to="megatron-bridge")
    api.import_hf(b, str(tmp_path / "mbb"), to="megatron-bridge")
    mlm = str(tmp_path / "mlm")
    as_megatron_lm(str(tmp_path / "mbb"), mlm, megatron_lm_args(padded_vocab_size=320), iteration=50)
    as_megatron_lm(str(tmp_path / "mba"), mlm, megatron_lm_args(padded_vocab_size=320), iteration=100)  # the tracker names 100
    latest, via = direct_and_via_nemo(mlm, str(tmp_path / "latest"), "none", 1)
    assert latest == via
    older, via = direct_and_via_nemo(mlm, str(tmp_path / "older"), "none", 1, iteration=50)
    assert older == via and older["rank0.safetensors"] != latest["rank0.safetensors"]
    code, _, err = cli("quantize", mlm, "-o", str(tmp_path / "cli"), "--algo", "none", "--iteration", "50", "-q")
    assert code == 0, err
    assert file_hashes(str(tmp_path / "cli")) == older
    shutil.rmtree(os.path.join(mlm, "iter_0000100"))
    for cmd in ("reshard", "quantize"):
        extra = ["--algo", "none"] if cmd == "quantize" else []
        code, _, err = cli(cmd, mlm, "-o", str(tmp_path / f"bad-{cmd}"), *extra)
        assert code == 2 and "names iteration 100, but iter_0000100/ is missing" in err, err
        assert len(err.strip().splitlines()) == 1 and not os.path.exists(tmp_path / f"bad-{cmd}")


@pytest.fixture(scope="module")
def mixtral_mlm(tmp_path_factory) -> str:
    """A tiny Mixtral as a Megatron-LM run (``--num-experts 4 --moe-router-topk 2``): Megatron-
    Bridge has no Mixtral bridge, so its weights are laid out through a test-only provider entry
    (as ``test_megatron_dirs.test_megatron_lm_moe_directories_without_a_bridge`` does)."""
    from test_family_matrix import make_model

    from nemo_convert.formats.megatron.providers import (
        GPT_PROVIDER,
        ProviderFamily,
        ProviderTable,
    )
    from nemo_convert.plugins.manager import Registry

    root = tmp_path_factory.mktemp("mixtral")
    src = make_model(str(root / "hf"), "mixtral", sliding_window=None)
    write_sentencepiece(os.path.join(src, "tokenizer.model"), vocab_size=128)
    declared = Registry.providers
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Registry, "providers", lambda self: ProviderTable(
            {**declared(self).families, "mixtral": ProviderFamily(GPT_PROVIDER, moe=True)}))
        mb = str(root / "mb")
        api.import_hf(src, mb, to="megatron-bridge")
    with open(os.path.join(mb, "iter_0000000", "run_config.yaml")) as f:
        model = yaml.safe_load(f)["model"]
    args = megatron_lm_args(ffn_hidden_size=model["ffn_hidden_size"], max_position_embeddings=model["seq_length"],
                            layernorm_epsilon=model["layernorm_epsilon"], rotary_base=model["rotary_base"],
                            vocab_size=128, padded_vocab_size=128, num_experts=4, moe_router_topk=2,
                            moe_layer_freq=1, moe_ffn_hidden_size=None)
    return as_megatron_lm(mb, str(root / "mlm"), args)


@pytest.mark.slow
@pytest.mark.parametrize("algo, tp, ep", [("none", 1, 1), ("int8_wo", 2, 2)])
def test_moe_megatron_lm_run_quantizes_as_its_nemo(mixtral_mlm, tmp_path, algo, tp, ep) -> None:
    assert api.inspect_checkpoint(mixtral_mlm)["family"] == "mixtral"
    direct, via = direct_and_via_nemo(mixtral_mlm, str(tmp_path), algo, tp, ep=ep)
    assert direct == via and sorted(n for n in direct if n.startswith("rank")) == [
        f"rank{r}.safetensors" for r in range(tp)]


def test_qnemo_and_training_checkpoints_are_refused_by_name(tmp_path, cli) -> None:
    """Refused before anything is read (the files here are empty) or written."""
    qnemo = tmp_path / "q"
    qnemo.mkdir()
    (qnemo / "config.json").write_text("{}")
    (qnemo / "rank0.safetensors").write_bytes(b"")
    code, _, err = cli("quantize", str(qnemo), "-o", str(tmp_path / "out"), "--algo", "none")
    assert code == 2 and "this is a .qnemo" in err and "trtllm-build" in err, err
    assert len(err.strip().splitlines()) == 1
    training = tmp_path / "run"
    training.mkdir()
    (training / "last.ckpt").write_bytes(b"")
    with pytest.raises(InputError, match="a training checkpoint; quantize reads none: run `nemo-convert from-ckpt`"):
        quantize(str(training), str(tmp_path / "out"), algo="none")
    assert not os.path.exists(tmp_path / "out")


def test_iteration_is_refused_for_a_hugging_face_folder(tmp_path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    with pytest.raises(InputError, match="--iteration applies to Megatron-Bridge / Megatron-LM"):
        quantize(str(hf), str(tmp_path / "out"), algo="none", iteration=3)
    assert not os.path.exists(tmp_path / "out")
