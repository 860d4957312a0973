"""Megatron-Bridge and Megatron-LM checkpoint directories: find, read and describe them;
the small files a Megatron-Bridge directory holds beside its weights.

Layout (``/work/shared/reference/megatron-dirs.md``)::

    OUT/latest_checkpointed_iteration.txt   "100" (or "release"), no newline
    OUT/iter_0000100/  (or OUT/release/)
        metadata.json .metadata __*_*.distcp   torch_dist weights: keys without ``model.``,
                                              layers stacked; ``optimizer.*`` and ``rng_state*``
                                              entries in Megatron-LM training saves
        common.pt                             Megatron-LM (and megatron-core ≤ 0.16) common state:
                                              ``args`` (argparse.Namespace), iteration, optimizer…
                                              (≥ 0.17: the byte entry ``common_state/shard_0_1``)
        run_config.yaml train_state.pt tokenizer/   Megatron-Bridge only
        mp_rank_XX[_YYY]/model_optim_rng.pt   Megatron-LM's legacy per-rank format instead

A directory is opened as a :class:`MegatronCheckpoint` (a
:class:`~nemo_convert.formats.nemo.nemo.NemoCheckpoint` whose config is translated into NeMo 1
fields by :mod:`.megatron_config`), so every command that reads a ``.nemo`` reads it.
Pickles (``common.pt``, ``model_optim_rng.pt``, the common-state entry) go through the
restricted unpickler: ``args`` becomes a plain dict, torch dtypes stay dtypes, nothing runs.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

from nemo_convert.errors import ConfigError, InputError, NemoConvertError
from nemo_convert.formats.dist_checkpoint.distckpt_meta import MetadataIndex
from nemo_convert.formats.dist_checkpoint.distckpt_read import DistCheckpointSource
from nemo_convert.formats.dist_checkpoint.sections import join_sections
from nemo_convert.formats.megatron.provider_read import args_to_nemo, provider_to_nemo
from nemo_convert.formats.megatron.providers import ProviderTable
from nemo_convert.formats.nemo.nemo import NemoCheckpoint, VocabTrimView
from nemo_convert.formats.nemo.nemo import _stage_sizes as stage_sizes
from nemo_convert.formats.nemo2.nemo2 import load_context_yaml
from nemo_convert.formats.nemo.nemo_ranks import WEIGHTS, PerRankSource
from nemo_convert.formats.io.tar_archive import Container, DirectoryContainer
from nemo_convert.hf_config import read_json_object
from nemo_convert.mapping.rules import Parallel
from nemo_convert.sharding.layout import ParallelLayout, embedding_on_last_stage, rank_dir
from nemo_convert.sharding.protocol import Strategies
from nemo_convert.tensors.base import ByteRegion, TensorSource, dtype_size
from nemo_convert.tokenizers.sentencepiece_patch import sentencepiece_vocab_size
from nemo_convert.tensors.safe_unpickle import safe_load, to_plain
from nemo_convert.tensors.torch_zip import load_archive, read_torch_zip
from nemo_convert.tensors.views import PrefixView, RenamedView

TRACKER = "latest_checkpointed_iteration.txt"
RUN_CONFIG = "run_config.yaml"
TRAIN_STATE = "train_state.pt"
LATEST_TRAIN_STATE = "latest_train_state.pt"
TOKENIZER_DIR = "tokenizer"
COMMON_PT = "common.pt"
COMMON_STATE = "common_state/shard_0_1"
LEGACY_FILE = "model_optim_rng.pt"
#: Our own record beside the weights (the source ``config.json``, the family, …): export
#: of a directory we wrote restores the source exactly. Megatron reads only its own files.
OURS = "nemo_convert.json"
KINDS = ("megatron-bridge", "megatron-lm")
_ITER = re.compile(r"^iter_(\d{7,})$")
_MP_RANK = re.compile(r"^mp_rank_(\d{2,})(?:_(\d{3,}))?$")
_NOT_MODEL = ("optimizer.", "rng_state")


def iter_dir_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def _is_iteration_folder(path: str) -> bool:
    names = set(os.listdir(path))
    return "metadata.json" in names or any(_MP_RANK.match(n) for n in names)


def _iteration_folders(root: str) -> list[str]:
    return sorted(n for n in os.listdir(root) if _ITER.match(n) and os.path.isdir(os.path.join(root, n)))


def is_megatron_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a Megatron-Bridge / Megatron-LM checkpoint directory, or one
    of its ``iter_XXXXXXX`` / ``release`` folders."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return False
    if os.path.isfile(os.path.join(path, TRACKER)):
        return True
    if _iteration_folders(path) or os.path.isdir(os.path.join(path, "release")):
        return True
    base = os.path.basename(os.path.normpath(path))
    return bool(_ITER.match(base) or base == "release") and _is_iteration_folder(path)


def resolve_iteration(path: str, iteration: int | None = None) -> str:
    """The iteration folder to read: ``--iteration N``, else the tracker's, else the highest
    ``iter_*`` (else ``release``). ``path`` may itself be the iteration folder."""
    base = os.path.basename(os.path.normpath(path))
    if (_ITER.match(base) or base == "release") and not os.path.isfile(os.path.join(path, TRACKER)):
        if iteration is not None:
            raise InputError(f"{path} is an iteration folder already; --iteration applies to its parent")
        return path
    if iteration is not None:
        folder = os.path.join(path, iter_dir_name(iteration))
        if not os.path.isdir(folder):
            have = ", ".join(_iteration_folders(path)) or "none"
            raise InputError(f"{path}: no {iter_dir_name(iteration)}/ for --iteration {iteration} (have: {have})")
        return folder
    tracker = os.path.join(path, TRACKER)
    if os.path.isfile(tracker):
        with open(tracker, encoding="utf-8", errors="replace") as f:
            text = f.read().strip()
        if text == "release":
            name = "release"
        elif text.isdigit():
            name = iter_dir_name(int(text))
        else:
            raise InputError(f"{tracker}: expected an iteration number or 'release', found {text[:40]!r}")
        folder = os.path.join(path, name)
        if not os.path.isdir(folder):
            raise InputError(f"{tracker} names iteration {text}, but {name}/ is missing")
        return folder
    iters = _iteration_folders(path)
    if iters:
        return os.path.join(path, iters[-1])
    if os.path.isdir(os.path.join(path, "release")):
        return os.path.join(path, "release")
    raise InputError(f"{path}: no {TRACKER}, iter_XXXXXXX/ or release/ folder")


@dataclass
class MegatronCheckpoint(NemoCheckpoint):
    """A Megatron-Bridge or Megatron-LM directory opened lazily (config in NeMo 1 fields)."""

    kind: str = "megatron-lm"
    iteration_dir: str = ""
    warnings: list[str] = field(default_factory=list)


def _load_pickle_file(path: str, trust_pickle: bool) -> Any:
    return read_torch_zip(ByteRegion(path, 0, os.path.getsize(path)), trust_pickle=trust_pickle)


def _load_pickle_bytes(data: bytes, where: str, trust_pickle: bool) -> Any:
    """A ``torch.save`` blob (zip, or a plain pickle of non-tensor data) read safely."""
    if data[:2] == b"PK":
        with tempfile.NamedTemporaryFile(prefix="nemo-convert-common-", suffix=".pt") as tmp:
            tmp.write(data)
            tmp.flush()
            return load_archive(ByteRegion(tmp.name, 0, len(data)), trust_pickle)[0]
    return to_plain(safe_load(io.BytesIO(data), trust=trust_pickle, where=where))


def _count_vocab_hf(folder: str) -> int | None:
    """The vocabulary of an HF tokenizer folder (``tokenizer.json``), if there is one."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            tok = json.load(f)
        ids = set((tok.get("model") or {}).get("vocab", {}).values())
        ids |= {a.get("id") for a in tok.get("added_tokens") or [] if isinstance(a, dict)}
        return max(i for i in ids if isinstance(i, int)) + 1 if ids else None
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def _count_vocab_sentencepiece(path: str) -> int | None:
    """The number of pieces of a SentencePiece model file, if it is one."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            return sentencepiece_vocab_size(f.read())
    except (OSError, NemoConvertError):
        return None


def _args_vocab(args: dict[str, Any], iteration_dir: str, warnings: list[str]) -> int | None:
    """The true vocabulary of a Megatron-LM run: ``--vocab-size``, else the tokenizer's
    (when its files are here or at ``tokenizer_model``: an HF folder's ``tokenizer.json``
    or ``tokenizer.model``, or a SentencePiece model file), else ``padded_vocab_size``."""
    if args.get("vocab_size"):
        return int(args["vocab_size"])
    for where in (os.path.join(iteration_dir, TOKENIZER_DIR), str(args.get("tokenizer_model") or "")):
        if where and os.path.isdir(where):
            n = _count_vocab_hf(where) or _count_vocab_sentencepiece(os.path.join(where, "tokenizer.model"))
        else:
            n = _count_vocab_sentencepiece(where) if where else None
        if n:
            return n
    padded = args.get("padded_vocab_size")
    if padded:
        warnings.append(f"the true vocabulary size is unknown (no tokenizer at {args.get('tokenizer_model')!r}); "
                        f"using padded_vocab_size={padded}: the embedding keeps its padding rows")
        return int(padded)
    return None


def _dropped_notes(dist: Any) -> list[str]:
    opt_n = opt_b = 0
    for raw in dist.raw_keys():
        if raw.startswith(_NOT_MODEL):
            item = dist.metadata.state_dict_metadata[raw]
            numel = 1
            for s in item.size:
                numel *= int(s)
            opt_n += 1
            opt_b += numel * dtype_size(item.properties.dtype_name)
    rng = [k for k in dist.object_keys if k.startswith("rng_state")]
    rng_b = sum(int(getattr(dist.metadata.storage_data.get(MetadataIndex(k)), "length", 0) or 0) for k in rng)
    notes = []
    if opt_n:
        notes.append(f"dropped {opt_n} optimizer tensor(s) ({opt_b} bytes): optimizer.*")
    if rng:
        notes.append(f"dropped {len(rng)} RNG state object(s) ({rng_b} bytes): rng_state*")
    return notes


def _common_notes(common: dict[str, Any], where: str) -> list[str]:
    gone = [k for k in ("optimizer", "opt_param_scheduler", "rng_state", "rerun_state_machine") if k in common]
    return [f"dropped {where}: {', '.join(gone)}"] if gone else []


#: Megatron-Core's local-spec layer names → the Transformer-Engine names we use (the torch_dist
#: save applies the same renaming itself; a legacy per-rank save does not).
LOCAL_SPEC_NAMES = {".input_layernorm.weight": ".self_attention.linear_qkv.layer_norm_weight",
                    ".input_layernorm.bias": ".self_attention.linear_qkv.layer_norm_bias",
                    ".pre_mlp_layernorm.weight": ".mlp.linear_fc1.layer_norm_weight",
                    ".pre_mlp_layernorm.bias": ".mlp.linear_fc1.layer_norm_bias"}


class LocalSpecNames(RenamedView):
    """A source with local-spec norm names presented under the Transformer-Engine names
    (norms are replicated, so the per-rank merge below needs no kind for them)."""

    def __init__(self, inner: TensorSource) -> None:
        names: dict[str, str] = {}
        for k in inner.keys():
            new = k
            for old, te in LOCAL_SPEC_NAMES.items():
                if k.endswith(old):
                    new = k[: -len(old)] + te
            names[new] = k
        super().__init__(inner, names)


class _LegacyRanks(Container):
    """Megatron-LM's ``mp_rank_XX[_YYY]/model_optim_rng.pt`` as the members that
    :class:`~nemo_convert.formats.nemo.nemo_ranks.PerRankSource` reads."""

    def __init__(self, folder: str, ranks: dict[tuple[int, int], str], pp: int) -> None:
        super().__init__(folder)
        for (t, p), name in ranks.items():
            path = os.path.join(folder, name, LEGACY_FILE)
            self._add_file(f"{rank_dir(t, p, pp)}/{WEIGHTS}", ByteRegion(path, 0, os.path.getsize(path)), path)


def _legacy_ranks(folder: str) -> dict[tuple[int, int], str]:
    ranks = {}
    for n in os.listdir(folder):
        m = _MP_RANK.match(n)
        if m and os.path.isfile(os.path.join(folder, n, LEGACY_FILE)):
            ranks[(int(m[1]), int(m[2] or 0))] = n
    return ranks


def open_megatron_dir(path: str, *, strategies: Strategies, providers: ProviderTable, iteration: int | None = None,
                      trust_pickle: bool = False,
                      kinds_for: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> MegatronCheckpoint:
    """Open a Megatron-Bridge or Megatron-LM checkpoint directory lazily; tensors come
    out under NeMo's logical names, optimizer and RNG state are left out (and noted).
    Per-rank ``mp_rank_XX`` files are merged with ``strategies`` (the registry's); a
    Megatron-Bridge ``run_config.yaml`` is read with ``providers`` (the registry's)."""
    folder = resolve_iteration(path, iteration)
    container = DirectoryContainer(folder)
    closers: list[Callable[[], None]] = [container.close]
    try:
        notes: list[str] = [f"read {os.path.basename(os.path.normpath(folder))}/"]
        warnings: list[str] = []
        ours: dict[str, Any] = {}
        ours_path = os.path.join(folder, OURS)
        if os.path.isfile(ours_path):
            ours = read_json_object(ours_path)
        run_config = os.path.join(folder, RUN_CONFIG)
        kind = "megatron-bridge" if os.path.isfile(run_config) else "megatron-lm"
        dist = None
        common: dict[str, Any] = {}
        ranks = _legacy_ranks(folder)
        if os.path.isfile(os.path.join(folder, "metadata.json")):
            dist = DistCheckpointSource(container.region, name=folder)
            closers.insert(0, dist.close)
            layout = "dist"
            notes += _dropped_notes(dist)
            if os.path.isfile(os.path.join(folder, COMMON_PT)):
                common = _load_pickle_file(os.path.join(folder, COMMON_PT), trust_pickle)
            elif COMMON_STATE in dist.object_keys:
                loaded = _load_pickle_bytes(dist.load_object_bytes(COMMON_STATE), f"{folder}:{COMMON_STATE}",
                                            trust_pickle)
                common = loaded[0] if isinstance(loaded, list) and loaded else loaded
        elif ranks:
            layout = "legacy"
            first = os.path.join(folder, ranks[min(ranks)], LEGACY_FILE)
            common = _load_pickle_file(first, trust_pickle)
        else:
            raise InputError(f"{folder}: no weights (neither metadata.json of a torch_dist checkpoint nor "
                             f"mp_rank_XX/{LEGACY_FILE})")
        if not isinstance(common, dict):
            common = {}
        notes += _common_notes(common, COMMON_PT if layout == "dist" else LEGACY_FILE)
        if kind == "megatron-bridge":
            doc = load_context_yaml(run_config)
            model = doc.get("model")
            if not isinstance(model, dict):
                raise InputError(f"{run_config}: no model: section")
            values, where = model, run_config
        else:
            args = common.get("args")
            if not isinstance(args, dict):
                where = f"{folder}/{COMMON_PT}" if layout == "dist" else first
                raise InputError(f"{where}: no Megatron-LM args (and no {RUN_CONFIG}): cannot tell the model config")
            values, where = args, f"{folder}: args"
        try:
            if kind == "megatron-bridge":
                cfg = provider_to_nemo(values, where, providers)
                vocab = int(values["vocab_size"]) if values.get("vocab_size") else None
            else:
                cfg = args_to_nemo(values, folder, providers)
                vocab = _args_vocab(values, folder, warnings)
            tp = int(values.get("tensor_model_parallel_size") or 1)
            pp = int(values.get("pipeline_model_parallel_size") or 1)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ConfigError(f"{where}: a model field is not understood ({type(exc).__name__}: {exc})") from None
        cfg["tensor_model_parallel_size"], cfg["pipeline_model_parallel_size"] = tp, pp
        if cfg.get("num_moe_experts"):
            cfg["expert_model_parallel_size"] = int(values.get("expert_model_parallel_size") or 1)
        section: dict[str, Any] = {**(cfg.get("nemo_convert") or {}), **ours}  # ours wins (exact source)
        section["source_format"] = kind
        if vocab:
            section["vocab_size"] = int(vocab)
        tok_dir = os.path.join(folder, TOKENIZER_DIR)
        if os.path.isdir(tok_dir):
            section["tokenizer_files"] = {n: f"{TOKENIZER_DIR}/{n}" for n in sorted(os.listdir(tok_dir))
                                          if os.path.isfile(os.path.join(tok_dir, n))}
        cfg["nemo_convert"] = section
        kinds = kinds_for(cfg) if kinds_for is not None else {}
        source: TensorSource
        if dist is not None:
            source = join_sections(PrefixView(dist, "", keep=lambda k: not k.startswith(_NOT_MODEL)), kinds)
            extra = list(dist.extra_state_keys)
        else:
            rtp, rpp = max(t for t, _ in ranks) + 1, max(p for _, p in ranks) + 1
            missing = sorted({(t, p) for t in range(rtp) for p in range(rpp)} - set(ranks))
            if missing:
                raise InputError(f"{folder}: per-rank files are incomplete; missing mp_rank_{missing[0][0]:02d}"
                                 + (f"_{missing[0][1]:03d}" if rpp > 1 else ""))
            if rtp > 1 and not kinds:
                raise InputError(f"{folder}: per-rank weights at TP={rtp} can only be merged through the model "
                                 "family's mapping, and no installed family handles this config (pass --family)")
            files = _LegacyRanks(folder, ranks, rpp)
            sizes = stage_sizes(files, "", (rtp, rpp), trust_pickle)  # Megatron may split stages unevenly
            playout = ParallelLayout.make(sum(sizes), rtp, rpp, stage_sizes=sizes,
                                          tied=embedding_on_last_stage(cfg), pipeline=strategies.pipeline)
            source = LocalSpecNames(PerRankSource(files, "", playout, kinds, vocab=vocab, trust_pickle=trust_pickle,
                                                  tensor_parallel=strategies.tensor))
            extra = []
        if vocab:
            source = VocabTrimView(source, {k for k, v in kinds.items() if v is Parallel.VOCAB}, int(vocab))
        return MegatronCheckpoint(path, container, "", cfg, layout, source, extra, kind=kind,
                                  iteration_dir=folder, notes=notes, warnings=warnings)
    except BaseException:
        for c in closers:
            c()
        raise


# ------------------------------------------------------------------ writing helpers
def train_state_bytes(step: int = 0) -> bytes:
    """``train_state.pt`` as Megatron-Bridge writes it: a dict of 0-dim tensors."""
    import torch
    state = {
        "step": torch.tensor(step, dtype=torch.int64),
        "consumed_train_samples": torch.tensor(0, dtype=torch.int64),
        "skipped_train_samples": torch.tensor(0, dtype=torch.int64),
        "consumed_valid_samples": torch.tensor(0, dtype=torch.int64),
        "floating_point_operations_so_far": torch.tensor(0.0, dtype=torch.float32),
        "do_train": torch.tensor(False),
        "do_valid": torch.tensor(False),
        "do_test": torch.tensor(False),
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def common_state(iteration: int = 0) -> dict[str, Any]:
    """``common.pt``'s content for a fresh checkpoint (what Megatron-Bridge stores as its
    common state)."""
    return {"checkpoint_version": 3.0, "iteration": iteration,
            "content_metadata": {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}}
