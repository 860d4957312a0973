"""Writes ``<tag>.common.pt``: the common state (``args`` and the rest of what
``generate_state_dict`` puts beside the sharded model) of a Megatron-LM training run, with
``args`` made by Megatron-LM's own argument code at one release tag.

Not run by the tests (they read the files it wrote). To regenerate, in a throwaway
environment that never touches the project's (Megatron-LM is not a dependency):

    git -C Megatron-LM archive <tag> megatron | tar -x -C /tmp/mlm/<tag>
    PYTHONPATH=/tmp/mlm/<tag> python make_args.py <tag> <out folder>

with torch, six, einops, setuptools (<70, for pkg_resources) and triton installed there
(import-time needs of ``megatron.training``; no GPU is used). What it runs, per tag:

* ``megatron/training/arguments.py`` ``parse_args`` on the command line of a tiny Llama
  pretraining run (flags in the style of ``examples/llama/train_llama3_8b_h100_fp8.sh``;
  flags a release does not know are left out by ``ignore_unknown_args``), then
  ``validate_args(args, {})`` as ``initialize_megatron`` does;
* then what training adds to the same namespace before ``save_checkpoint``:
  ``args.model_type`` (``megatron/training/training.py`` ``pretrain``: ``args.model_type =
  model_type``, the ``ModelType.encoder_or_decoder`` that ``pretrain_gpt.py`` passes),
  ``padded_vocab_size`` (``tokenizer.py``: ``_vocab_size_with_padding``, here from
  ``--vocab-size``), ``iteration``, ``num_floating_point_operations_so_far``,
  ``consumed_*_samples``, ``do_train``/``do_valid``/``do_test``, ``curr_iteration``;
* ``checkpointing.py`` ``generate_state_dict``: ``state_dict['args'] = args``, with
  ``checkpoint_version`` 3.0 and ``iteration``; the optimizer, scheduler and RNG entries are
  left out (they are sharded entries or plain dicts, already read elsewhere).

Shims (the only code not Megatron-LM's): Python 3.11 lacks ``typing.override`` (imported by
``megatron/training/models/hybrid.py`` from core_v0.19), which is given
``typing_extensions.override``; ``torch.cuda`` is absent (validate_args asks the device
capability in some releases, which is answered as an H100's (9, 0)).
"""

from __future__ import annotations

import json
import os
import pickletools
import sys
import typing
import zipfile

import torch

FLAGS = [
    "--use-mcore-models", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "96",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "16",
    "--seq-length", "64", "--max-position-embeddings", "256", "--position-embedding-type", "rope",
    "--rotary-base", "10000", "--rotary-percent", "1.0", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
    "--swiglu", "--init-method-std", "0.02", "--attention-backend", "fused", "--normalization", "RMSNorm",
    "--norm-epsilon", "1e-5", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
    "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "100", "--lr", "3e-4",
    "--min-lr", "3e-5", "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--weight-decay", "0.1",
    "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--bf16", "--tensor-model-parallel-size", "1",
    "--pipeline-model-parallel-size", "1", "--use-distributed-optimizer", "--tokenizer-type", "HuggingFaceTokenizer",
    "--tokenizer-model", "/data/llama-tokenizer", "--vocab-size", "320", "--make-vocab-size-divisible-by", "128",
    "--data-path", "/data/corpus_text_document", "--split", "99,1,0", "--log-interval", "1", "--eval-iters", "1",
    "--eval-interval", "100", "--save", "/ckpt", "--save-interval", "100", "--ckpt-format", "torch_dist",
    "--transformer-impl", "local",
]


#: A tiny Nemotron-H-like hybrid run (``hybrid``: the sizes of ``tests/tiny_hybrid.py``'s
#: ``nemotron_h_8b``, pattern ``M-*M-M``), flags in the style of ``examples/mamba/train.sh``
#: (core_v0.16.1: ``pretrain_mamba.py`` with ``--spec megatron.core.models.mamba.mamba_layer_specs
#: mamba_stack_spec`` and ``--position-embedding-type none``; core_v0.19.0: ``pretrain_hybrid.py``,
#: ``--hybrid-layer-pattern`` and ``megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec``)
#: plus Nemotron-H's squared-ReLU MLP and Mamba sizes. ``{pattern}`` and ``{spec}`` are filled
#: per tag (:func:`_hybrid_flags`). Written at core_v0.13.1 … core_v0.19.0 (``hybrid``) and from
#: core_v0.16.1 (``hybrid-moe``: until core_v0.15.3 validate_args asserts "Model Spec must be None
#: when using MoEs").
HYBRID_FLAGS = [
    "--use-mcore-models", "--num-layers", "6", "--hidden-size", "64", "--ffn-hidden-size", "96",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "128",
    "--seq-length", "64", "--max-position-embeddings", "64", "--position-embedding-type", "none",
    "{pattern}", "M-*M-M", "--spec", "{spec}", "--is-hybrid-model",
    "--mamba-state-dim", "16", "--mamba-head-dim", "8", "--mamba-num-groups", "2", "--mamba-num-heads", "8",
    "--squared-relu", "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--init-method-std", "0.02",
    "--normalization", "RMSNorm", "--norm-epsilon", "1e-5", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "100",
    "--lr", "2.5e-4", "--min-lr", "2.5e-5", "--lr-decay-style", "cosine", "--clip-grad", "1.0",
    "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--bf16",
    "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1", "--use-distributed-optimizer",
    "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "/data/nemotron-h-tokenizer",
    "--vocab-size", "256", "--make-vocab-size-divisible-by", "128", "--data-path", "/data/corpus_text_document",
    "--split", "99,1,0", "--log-interval", "1", "--eval-iters", "1", "--eval-interval", "100", "--save", "/ckpt",
    "--save-interval", "100", "--ckpt-format", "torch_dist", "--no-create-attention-mask-in-dataloader",
]
#: ``hybrid-moe``: the sizes of ``tests/tiny_hybrid.py``'s ``nemotron_3_nano`` (pattern ``MEM*EM``,
#: head size 16) with its router as Nemotron-3 Nano is trained (sigmoid scores, expert bias,
#: top-2 renormalised and scaled by 2.5, one shared expert).
HYBRID_MOE_FLAGS = [
    "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
    "--moe-shared-expert-intermediate-size", "48", "--moe-router-score-function", "sigmoid",
    "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor", "2.5", "--moe-router-dtype", "fp32",
    "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-4",
    "--moe-token-dispatcher-type", "alltoall",
]


#: GPT runs of the families other than Llama (``<tag>+<mode>``), each the tiny model of
#: ``tests/test_family_matrix.py``'s ``make_model`` for that family (hidden 64, FFN 96, 2
#: layers, 4 heads in 2 groups, 64 positions, vocabulary 128, untied) as Megatron-LM trains it:
#:
#: * ``nemotron4``: in the style of NVIDIA's Nemotron-4 / Minitron Megatron-LM runs — squared
#:   ReLU, LayerNorm with zero-centred gamma, half-rotary RoPE, head size 32 (the tiny
#:   Nemotron's ``head_dim``), no biases (Megatron-Bridge's Nemotron: ``PROVIDER_MODEL_OVERRIDES``
#:   in tests/test_megatron_dirs.py). The zero-centred gamma is ``--apply-layernorm-1p`` in every
#:   release: up to core_v0.15.3 its own argument (``core_transformer_config_from_args``:
#:   ``layernorm_zero_centered_gamma = args.apply_layernorm_1p``, core_v0.15.3 ``arguments.py``
#:   line 1249), from core_v0.16.1 the CLI name of TransformerConfig's ``layernorm_zero_centered_gamma``
#:   (core_v0.16.1 ``transformer_config.py`` lines 155-157, ``argparse_meta`` ``arg_names``);
#: * ``qwen2``: gated SiLU, RMSNorm (eps 1e-6), q/k/v biases only (``--add-qkv-bias`` with
#:   ``--disable-bias-linear``);
#: * ``mistral``: gated SiLU, RMSNorm (eps 1e-6), no biases, a 4-token sliding window
#:   (``--window-size 3,0``: Megatron's ``[W-1, 0]``).
GPT_MODE_FLAGS: dict[str, list[str]] = {
    "nemotron4": ["--squared-relu", "--apply-layernorm-1p", "--normalization", "LayerNorm", "--norm-epsilon", "1e-5",
                  "--rotary-percent", "0.5", "--kv-channels", "32", "--disable-bias-linear"],
    "qwen2": ["--swiglu", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--add-qkv-bias",
              "--disable-bias-linear", "--kv-channels", "16"],
    "mistral": ["--swiglu", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--window-size", "3,0",
                "--disable-bias-linear", "--kv-channels", "16"],
}
#: What every GPT mode shares (the tiny models' sizes and a pretraining run's knobs).
GPT_MODE_BASE = [
    "--use-mcore-models", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "96",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
    "--seq-length", "64", "--max-position-embeddings", "64", "--position-embedding-type", "rope",
    "--rotary-base", "10000", "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--init-method-std", "0.02",
    "--untie-embeddings-and-output-weights", "--micro-batch-size", "1", "--global-batch-size", "8",
    "--train-iters", "100", "--lr", "3e-4", "--min-lr", "3e-5", "--lr-decay-style", "cosine", "--clip-grad", "1.0",
    "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--bf16",
    "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1", "--use-distributed-optimizer",
    "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "/data/tokenizer", "--vocab-size", "128",
    "--make-vocab-size-divisible-by", "128", "--data-path", "/data/corpus_text_document", "--split", "99,1,0",
    "--log-interval", "1", "--eval-iters", "1", "--eval-interval", "100", "--save", "/ckpt",
    "--save-interval", "100", "--ckpt-format", "torch_dist", "--transformer-impl", "local",
]


def _gpt_mode_flags(mode: str) -> list[str]:
    """:data:`GPT_MODE_BASE` with :data:`GPT_MODE_FLAGS` ``[mode]`` (parsed strictly: a flag the
    release does not know fails rather than being dropped)."""
    return GPT_MODE_BASE + GPT_MODE_FLAGS[mode]


def _hybrid_flags(moe: bool) -> list[str]:
    """:data:`HYBRID_FLAGS` for the tag on ``PYTHONPATH``: ``--hybrid-layer-pattern`` and the
    hybrid stack spec where the release has them (core_v0.19), else ``--hybrid-override-pattern``
    and the Mamba stack spec (flags a release does not know would be dropped silently by
    ``ignore_unknown_args``, hence the choice by the release's own files)."""
    import importlib.util

    newer = importlib.util.find_spec("megatron.core.models.hybrid") is not None
    pattern = "--hybrid-layer-pattern" if newer else "--hybrid-override-pattern"
    spec = (["megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"] if newer else
            ["megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"])
    flags: list[str] = []
    for f in HYBRID_FLAGS:
        flags += [pattern] if f == "{pattern}" else spec if f == "{spec}" else [f]
    if moe:
        i = flags.index("M-*M-M")
        flags[i] = "MEM*EM"
        flags[flags.index("--kv-channels") + 1] = "16"
        flags += HYBRID_MOE_FLAGS
    return flags


def pickle_globals(path: str) -> list[str]:
    """The globals (``module.name``) a ``torch.save`` file's pickle names (protocol 2: GLOBAL)."""
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    return sorted({arg.replace(" ", ".") for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"})


def main(tag: str, out: str, *extra: str) -> None:
    """``extra``: more flags; the file is then ``<tag>+<first extra flag>.common.pt``. A first
    extra of ``nemotron4``, ``qwen2`` or ``mistral`` is no flag: the run is then that family's
    GPT run (:func:`_gpt_mode_flags`). A first extra of ``hybrid`` or ``hybrid-moe`` is no flag: the run is then the hybrid one
    (:func:`_hybrid_flags`, ``pretrain_mamba.py``'s ``model_type``, the same
    ``ModelType.encoder_or_decoder``: core_v0.16.1 ``pretrain_mamba.py`` line 363, core_v0.19.0
    ``pretrain_hybrid.py`` line 472)."""
    if not hasattr(typing, "override"):  # shim: Python 3.12's typing.override (core_v0.19 imports it)
        import typing_extensions
        typing.override = typing_extensions.override  # type: ignore[attr-defined]
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # shim: no GPU here
    os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")  # as the examples set it
    kind = extra[0] if extra and extra[0] in ("hybrid", "hybrid-moe") else None
    mode = extra[0] if extra and extra[0] in GPT_MODE_FLAGS else None
    flags = _hybrid_flags(kind == "hybrid-moe") if kind else _gpt_mode_flags(mode) if mode else FLAGS
    sys.argv = ["pretrain_mamba.py" if kind else "pretrain_gpt.py", *flags, *extra[1 if kind or mode else 0:]]
    from megatron.training import arguments

    args = arguments.parse_args(ignore_unknown_args=not mode)
    arguments.validate_args(args, {})
    try:
        from megatron.core.enums import ModelType
    except ImportError:  # older layout
        from megatron.core.models.enums import ModelType  # type: ignore[no-redef]
    args.model_type = ModelType.encoder_or_decoder
    args.padded_vocab_size = 256 if kind else 128 if mode else 384  # the vocabulary rounded up to 128 x TP
    args.iteration = 100
    args.num_floating_point_operations_so_far = 0.0
    args.consumed_train_samples = 800
    args.skipped_train_samples = 0
    args.consumed_valid_samples = 8
    args.do_train, args.do_valid, args.do_test = True, True, False
    args.curr_iteration = 100
    state = {"args": args, "checkpoint_version": 3.0, "iteration": 100,
             "num_floating_point_operations_so_far": 0.0}
    os.makedirs(out, exist_ok=True)
    name = tag + (f"+{extra[0].lstrip('-')}" if extra else "")
    path = os.path.join(out, f"{name}.common.pt")
    torch.save(state, path)
    index_path = os.path.join(out, "index.json")
    index: dict = {}
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
    index[name] = {"flags": (flags if kind or mode else []) + list(extra[1 if kind or mode else 0:]), "commit": os.environ.get("MEGATRON_LM_COMMIT", ""), "attributes": len(vars(args)),
                  "globals": pickle_globals(path)}
    with open(index_path, "w") as f:
        json.dump(dict(sorted(index.items())), f, indent=1)
    print(tag, len(vars(args)), "attributes")


if __name__ == "__main__":
    main(*sys.argv[1:])
