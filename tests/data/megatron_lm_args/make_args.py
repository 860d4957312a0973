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


def pickle_globals(path: str) -> list[str]:
    """The globals (``module.name``) a ``torch.save`` file's pickle names (protocol 2: GLOBAL)."""
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    return sorted({arg.replace(" ", ".") for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"})


def main(tag: str, out: str, *extra: str) -> None:
    """``extra``: more flags; the file is then ``<tag>+<first extra flag>.common.pt``."""
    if not hasattr(typing, "override"):  # shim: Python 3.12's typing.override (core_v0.19 imports it)
        import typing_extensions
        typing.override = typing_extensions.override  # type: ignore[attr-defined]
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # shim: no GPU here
    os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")  # as the examples set it
    sys.argv = ["pretrain_gpt.py", *FLAGS, *extra]
    from megatron.training import arguments

    args = arguments.parse_args(ignore_unknown_args=True)
    arguments.validate_args(args, {})
    try:
        from megatron.core.enums import ModelType
    except ImportError:  # older layout
        from megatron.core.models.enums import ModelType  # type: ignore[no-redef]
    args.model_type = ModelType.encoder_or_decoder
    args.padded_vocab_size = 384  # 320 rounded up to 128 x TP
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
    index = json.load(open(index_path)) if os.path.exists(index_path) else {}
    index[name] = {"flags": list(extra), "commit": os.environ.get("MEGATRON_LM_COMMIT", ""), "attributes": len(vars(args)),
                  "globals": pickle_globals(path)}
    with open(index_path, "w") as f:
        json.dump(dict(sorted(index.items())), f, indent=1)
    print(tag, len(vars(args)), "attributes")


if __name__ == "__main__":
    main(*sys.argv[1:])
