"""Finding a training checkpoint: one ``.ckpt``, per-rank folders, or a distributed
(``torch_dist``) folder — and, in a checkpoints folder holding several, which one."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from nemo_convert.errors import InputError
from nemo_convert.formats.detect import detect, require_kind
from nemo_convert.sharding.layout import detect_ranks, parse_rank_dir, rank_dir

CKPT_SUFFIX = ".ckpt"
DIST_MARKER = "metadata.json"
COMMON_PT = "common.pt"
EXTRA_STATE = "_extra_state"
#: Where a strategy may put the LightningModule's ``model`` attribute, most specific first:
#: NeMo 1 (``model.``), with O2's wrapper unhidden (``model.module.``), NeMo 2
#: (``module.``), and torch DCP saves of Lightning's whole checkpoint dict (``state_dict.…``).
WEIGHT_PREFIXES = (
    "state_dict.model.module.", "sharded_state_dict.model.module.",
    "state_dict.model.", "sharded_state_dict.model.",
    "state_dict.module.", "sharded_state_dict.module.",
    "model.module.", "model.", "module.",
)
_VIRTUAL_PP = re.compile(r"^(?:(?:sharded_)?state_dict\.)?model\d+\.")
#: Top-level entries of a Lightning checkpoint that describe the run (kept in the report).
RUN_FIELDS = ("epoch", "global_step", "pytorch-lightning_version")
#: Where Lightning keeps the hyper-parameters (the model config).
HPARAM_FIELDS = ("hyper_parameters", "hparams_name", "hparams_type")
DIST_SUMMARY = "a distributed (torch_dist) checkpoint"


# ------------------------------------------------------------------------ locating
@dataclass
class Located:
    """Where a training checkpoint's files are."""

    kind: str  # "ckpt" (one file), "per-rank" (rank folders) or "dist" (torch_dist folder)
    path: str  # the .ckpt file, the folder holding the rank folders, or the dist folder
    name: str | None = None  # the file name inside each rank folder
    tp: int = 1
    pp: int = 1
    base_dirs: tuple[str, ...] = ()  # where relative paths of the config are looked up
    tp_pp_names: bool = False  # rank folders named tp_rank_XX_pp_rank_YYY even when PP = 1

    def rank_folder(self, tp_rank: int, pp_rank: int) -> str:
        if self.tp_pp_names:
            return f"tp_rank_{tp_rank:02d}_pp_rank_{pp_rank:03d}"
        return rank_dir(tp_rank, pp_rank, self.pp)

    def rank_file(self, tp_rank: int, pp_rank: int) -> str:
        assert self.name is not None
        return os.path.join(self.path, self.rank_folder(tp_rank, pp_rank), self.name)

    def describe(self) -> str:
        if self.kind == "per-rank":
            return f"{self.tp * self.pp} per-rank files {self.name} (TP={self.tp}, PP={self.pp})"
        return "a Lightning .ckpt file" if self.kind == "ckpt" else DIST_SUMMARY


def _is_dist(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, DIST_MARKER))


def _rank_folders(folder: str) -> list[str]:
    return sorted(e for e in os.listdir(folder)
                  if parse_rank_dir(e) is not None and os.path.isdir(os.path.join(folder, e)))


def _candidates(folder: str) -> list[str]:
    """The checkpoints directly in ``folder``: ``.ckpt`` files and dist checkpoint folders."""
    out = []
    for e in sorted(os.listdir(folder)):
        full = os.path.join(folder, e)
        if (e.endswith(CKPT_SUFFIX) and os.path.isfile(full)) or (os.path.isdir(full) and _is_dist(full)):
            out.append(e)
    return out


def locate(src: str, checkpoint_name: str | None = None) -> Located:
    """Find the training checkpoint ``src`` names (see the module docstring).

    ``src`` may be a ``.ckpt`` file, a dist checkpoint folder, a folder of rank folders, or
    a checkpoints folder holding several of those; ``checkpoint_name`` picks one file name
    (or dist folder) where there is a choice. Raises :class:`InputError` naming the choices
    or what is missing.
    """
    src = os.path.normpath(src)
    found = detect(src)
    if found.kind in ("hf", "nemo", "qnemo", "safetensors"):  # pointed at a model, not a training run
        require_kind(src, ("training",), "a training checkpoint")
    if os.path.isfile(src):
        if checkpoint_name and checkpoint_name != os.path.basename(src):
            raise InputError(f"{src} is a file; --checkpoint-name {checkpoint_name!r} applies to folders")
        folder = os.path.dirname(os.path.abspath(src))
        if parse_rank_dir(os.path.basename(folder)) is not None:
            parent = os.path.dirname(folder)
            ranks = _rank_folders(parent)
            if len(ranks) > 1:
                raise InputError(
                    f"{src} is the file of one model-parallel rank ({os.path.basename(folder)}, one of "
                    f"{len(ranks)} rank folders); pass the folder that holds the rank folders instead: "
                    f"{parent} --checkpoint-name {os.path.basename(src)}")
            folder = parent
        return Located("ckpt", src, base_dirs=(folder,))
    if not os.path.isdir(src):
        raise InputError(f"{src}: no such file or folder")
    if _is_dist(src):
        if checkpoint_name:
            raise InputError(f"{src} is a distributed checkpoint; --checkpoint-name applies to folders "
                             "that hold several checkpoints")
        return Located("dist", src, base_dirs=(src, os.path.dirname(os.path.abspath(src))))
    if os.path.isfile(os.path.join(src, "weights", DIST_MARKER)) and os.path.isdir(os.path.join(src, "context")):
        raise InputError(f"{src} is a NeMo 2.0 checkpoint (weights/ and context/): convert it with "
                         f"`nemo-convert reshard {src} -o OUT.nemo`")
    ranks = _rank_folders(src)
    if ranks:
        return _locate_ranks(src, ranks, checkpoint_name)
    cands = _candidates(src)
    if checkpoint_name:
        for cand in (checkpoint_name, checkpoint_name.removesuffix(CKPT_SUFFIX)):
            full = os.path.join(src, cand)
            if os.path.isfile(full) or (os.path.isdir(full) and _is_dist(full)):
                return locate(full)
        raise InputError(f"{src}: no checkpoint named {checkpoint_name!r}"
                         + (f" (found: {', '.join(cands)})" if cands else ""))
    if len(cands) == 1:
        return locate(os.path.join(src, cands[0]))
    if not cands:
        raise InputError(f"{src}: no training checkpoint here: expected a .ckpt file, rank folders "
                         "(mp_rank_XX/ or tp_rank_XX_pp_rank_YYY/), or a distributed checkpoint folder "
                         "(with metadata.json)")
    raise InputError(f"{src} holds {len(cands)} checkpoints: {', '.join(cands)}; pick one with "
                     "--checkpoint-name")


def _locate_ranks(src: str, ranks: list[str], checkpoint_name: str | None) -> Located:
    styles = {n.startswith("mp_rank_") for n in ranks}
    if len(styles) > 1:
        raise InputError(f"{src} mixes mp_rank_XX and tp_rank_XX_pp_rank_YYY folders")
    tp, pp = detect_ranks(ranks)  # raises, naming the missing rank folders
    loc = Located("per-rank", src, None, tp, pp, base_dirs=(src,), tp_pp_names=not styles.pop())
    if checkpoint_name:
        lacking = [r for r in ranks if not os.path.isfile(os.path.join(src, r, checkpoint_name))]
        if lacking:
            raise InputError(f"{src}: {checkpoint_name!r} is missing from rank folder(s) {', '.join(lacking)}")
        loc.name = checkpoint_name
        return loc
    files = []
    for r in ranks:
        folder = os.path.join(src, r)
        files.append({e for e in os.listdir(folder)
                      if e.endswith(CKPT_SUFFIX) and os.path.isfile(os.path.join(folder, e))})
    union, common = set().union(*files), set.intersection(*files)
    if len(union) == 1 and common == union:
        loc.name = union.pop()
        return loc
    if not union:
        raise InputError(f"{src}: the rank folders hold no .ckpt file (name the file with --checkpoint-name)")
    partial = sorted(union - common)
    raise InputError(f"{src}: the rank folders hold {len(union)} checkpoints: {', '.join(sorted(union))}"
                     + (f" ({', '.join(partial)} not in every rank folder)" if partial else "")
                     + "; pick one with --checkpoint-name")
