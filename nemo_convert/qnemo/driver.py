"""``quantize``: an HF folder, a ``.nemo``, a NeMo 2 folder or a Megatron-Bridge /
Megatron-LM directory → a ``.qnemo`` (a TensorRT-LLM checkpoint), a thin command over the one output step (:mod:`nemo_convert.convert.output`) with the ``trtllm``
target (:mod:`nemo_convert.trtllm_target`)::

    check the options; choose_target("trtllm") + check_output     (before the source is opened)
    open the source → pick the family → plan (NeMo logical tensors)
    write_output(target, OutputJob(..., quantization=QuantSettings(...), model=...))

The source is opened as NeMo logical tensors: an HF folder through the family's ``to_nemo``
plan (with the planner's coverage proof, its config translated as ``import`` translates
it); a ``.nemo``, a NeMo 2 folder or a Megatron directory as its own tensors, opened as
``reshard`` and ``export`` open it (its config completed as export completes it). The
target's writer (:mod:`.target_writer`) plans the family's TensorRT-LLM target over them
with the same planner, adds the quantization tasks, calibrates, quantizes and writes.

Under torchrun every process checks the options and opens the source; they agree
(:meth:`~nemo_convert.workers.Workers.run_all`): one failing stops all of them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_convert.compute import CPU, resolve_device
from nemo_convert.convert.checkpoint import Checkpoint, open_checkpoint
from nemo_convert.convert.common import open_nemo_source
from nemo_convert.convert.hf_to_nemo import plan_import
from nemo_convert.convert.nemo_to_hf import export_hf, plan_to_hf
from nemo_convert.convert.output import check_output, choose_target, write_output
from nemo_convert.dtypes import parse_dtype
from nemo_convert.engine import NoProgress, Progress
from nemo_convert.errors import InputError, UnsupportedError
from nemo_convert.families.trtllm import TrtllmTable
from nemo_convert.formats.detect import DESCRIPTIONS, Kind, detect, require_kind
from nemo_convert.formats.io.staging import refuse_overlap
from nemo_convert.formats.nemo.nemo import dump_yaml
from nemo_convert.hf_config import read_json_object
from nemo_convert.mapping.planner import Plan, identity_plan, nemo_parallel_kinds
from nemo_convert.plugins.manager import Registry, get_registry
from nemo_convert.plugins.records import ModelFamily, OutputJob, OutputTarget, QuantSettings, RunnableModel
from nemo_convert.qnemo.plan import ALGOS
from nemo_convert.qnemo.target_writer import QuantStats
from nemo_convert.qnemo.tokenizer import TOKENIZER_CONFIG, tokenizer_from_hf, tokenizer_from_nemo
from nemo_convert.quant.algorithms import DEFAULT_GROUP_SIZE
from nemo_convert.tensors.base import TensorSource
from nemo_convert.workers import SINGLE, Workers

KV_CACHE_CHOICES = ("none", "fp8")


@dataclass
class QuantizeReport:
    """What ``quantize`` wrote; ``--json`` prints :meth:`as_dict`."""

    output: str
    family: str
    algo: str
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    dtype: str
    tp: int
    pp: int
    files: list[str]
    tensors: int
    bytes: int
    seconds: float
    compressed: bool = False
    calibration: dict[str, Any] | None = None
    dropped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ep: int = 1

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class _Opened:
    """The source opened and planned as NeMo logical tensors: ``plan`` over ``source``
    (an HF folder's ``to_nemo`` plan over its tensors, or a ``.nemo``'s identity)."""

    ck: Checkpoint
    fam: ModelFamily
    cfg: dict[str, Any]
    plan: Plan
    source: TensorSource
    kinds: dict[str, Any]
    hf_cfg: dict[str, Any]
    tok_files: dict[str, bytes]
    warnings: list[str]

    def close(self) -> None:
        self.ck.close()


def _trtllm_table(fam: ModelFamily, reg: Registry) -> TrtllmTable:
    """The family's TensorRT-LLM target, or a one-line refusal naming the family."""
    table = fam.trtllm
    if table is None:
        have = sorted(p.record.name for p in reg.families.values() if p.record.trtllm is not None)
        raise UnsupportedError(f"model family {fam.name!r} declares no TensorRT-LLM mapping, so it cannot be "
                               f"quantized to a .qnemo (families that can: {', '.join(have) or 'none'})")
    if not isinstance(table, TrtllmTable):
        raise UnsupportedError(f"model family {fam.name!r}: its trtllm field is a {type(table).__name__}, "
                               "not a nemo_convert.families.trtllm.TrtllmTable")
    return table


def _check_options(src: str, out: str, reg: Registry, *, algo: str, kv_cache: str, device: str | torch.device,
                   dtype: str | torch.dtype | None, overwrite: bool, compress: bool,
                   workers: Workers) -> tuple[torch.device, torch.dtype | None, OutputTarget]:
    """The one-line errors of the options alone, and the ``trtllm`` target checked
    writable at ``out``; ``(device, dtype, target)``."""
    if algo not in ALGOS:
        raise UnsupportedError(f"unknown --algo {algo!r}; expected one of {', '.join(ALGOS)}")
    if kv_cache not in KV_CACHE_CHOICES:
        raise UnsupportedError(f"unknown --kv-cache {kv_cache!r}; expected none or fp8")
    dev = resolve_device(device)
    want_dtype = parse_dtype(dtype)
    target = choose_target(reg, "trtllm", workers=workers, quantization=QuantSettings(algo))
    refuse_overlap(src, out)
    check_output(target, out, overwrite=overwrite, packed=compress)
    return dev, want_dtype, target


def _tokenizer_members(section: dict[str, Any] | None, files: dict[str, bytes]) -> dict[str, bytes]:
    """The ``.qnemo``'s tokenizer members: the files, and ``tokenizer_config.yaml`` of ``section``."""
    return {**files, **({} if section is None else {TOKENIZER_CONFIG: dump_yaml(section)})}


#: What ``quantize`` reads: every kind :func:`~nemo_convert.convert.checkpoint.open_checkpoint`
#: reads that holds a model (a ``.qnemo`` is quantize's own output: refused by name).
SOURCES: tuple[Kind, ...] = ("hf", "nemo", "nemo2", "megatron")
_WHAT = "a Hugging Face folder, a .nemo, a NeMo 2 folder or a Megatron-Bridge / Megatron-LM directory"


def _open_source(src: str, reg: Registry, *, family: str | None, trust_pickle: bool,
                 iteration: int | None) -> Checkpoint:
    """``src`` opened lazily: an HF folder as :func:`open_checkpoint` opens it, anything else
    through the opening ``export`` and ``reshard`` use
    (:func:`~nemo_convert.convert.common.open_nemo_source`, ``iteration`` picking a Megatron
    directory's ``iter_XXXXXXX/``). A training checkpoint is refused naming ``from-ckpt``:
    its config and tokenizer are gathered by that command, and calibration runs a Hugging Face
    export of the source, which a training checkpoint has none of."""
    kind = detect(src).kind
    if kind == "training":
        raise InputError(f"{src}: this is {DESCRIPTIONS['training']}; quantize reads none: run `nemo-convert "
                         "from-ckpt` on it first, then quantize the .nemo it writes")
    kind = require_kind(src, SOURCES, _WHAT).kind
    if kind == "hf":
        if iteration is not None:
            raise InputError(f"{src}: --iteration applies to Megatron-Bridge / Megatron-LM checkpoint directories")
        return open_checkpoint(src, trust_pickle=trust_pickle, accept=("hf",), what=_WHAT)
    ckpt = open_nemo_source(src, reg, family=family, compute=CPU, trust_pickle=trust_pickle, iteration=iteration)
    return Checkpoint(src, getattr(ckpt, "kind", "nemo"), ckpt.config, ckpt.source, ckpt.layout, ckpt)


def _open(src: str, reg: Registry, *, family: str | None, trust_pickle: bool, rope_scaling: bool = True,
          ignore_config_keys: tuple[str, ...] = (), iteration: int | None = None) -> _Opened:
    """Open ``src`` lazily as NeMo logical tensors — an HF folder through the family's
    ``to_nemo`` plan (its config translated as ``import`` translates it); a ``.nemo``, a NeMo 2
    folder or a Megatron-Bridge / Megatron-LM directory as its own tensors (its config
    completed as export completes it: the true vocabulary, token ids, RoPE scaling); nothing
    is written."""
    ck = _open_source(src, reg, family=family, trust_pickle=trust_pickle, iteration=iteration)
    try:
        if ck.format == "hf":
            fam = reg.family(family) if family else reg.family_for_hf_config(ck.config)
            hf_cfg = ck.config
            tok_section, tok_files = tokenizer_from_hf(src, hf_cfg, fam.hf.tokenizer_files)
            warnings: list[str] = []
            _trtllm_table(fam, reg)
            nemo_cfg, plan = plan_import(fam, hf_cfg, ck.source, ignore_config_keys=ignore_config_keys)
            source: TensorSource = ck.source
            kinds = nemo_parallel_kinds(fam.mapping(nemo_cfg), nemo_cfg)
        else:
            if ignore_config_keys:
                raise UnsupportedError(f"--ignore-config-key applies to a Hugging Face source; {src} is "
                                       f"{detect(src).description}, whose config is NeMo's own")
            fam = reg.family(family) if family else reg.family_for_nemo_config(ck.config)
            prep, hf_cfg, _ = plan_to_hf(ck.handle, fam, rope_scaling=rope_scaling)
            tok_section, tok_files = tokenizer_from_nemo(ck.handle, ck.config)
            warnings = prep.warnings
            _trtllm_table(fam, reg)
            nemo_cfg, source = prep.cfg, prep.source
            kinds = nemo_parallel_kinds(fam.mapping(nemo_cfg), nemo_cfg)
            plan = identity_plan(source, kinds)
    except BaseException:
        ck.close()
        raise
    return _Opened(ck, fam, nemo_cfg, plan, source, kinds, hf_cfg, _tokenizer_members(tok_section, tok_files),
                   warnings)


def _runnable(src: str, opened: _Opened, reg: Registry, *, trust_pickle: bool, rope_scaling: bool,
              ignore_config_keys: tuple[str, ...], iteration: int | None = None) -> RunnableModel:
    """The model as transformers loads it, for calibration: an HF source's own folder, or
    any other source (a ``.nemo``, a NeMo 2 folder, a Megatron directory's ``iteration``)
    exported to a scratch folder by ``export`` (removed afterwards)."""
    is_hf = opened.ck.format == "hf"
    family = opened.fam.name

    @contextmanager
    def folder(dtype: torch.dtype, scratch: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if is_hf:
            yield src, opened.hf_cfg
            return
        os.makedirs(scratch, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".nemo-convert-calib-", dir=scratch)
        try:
            hf = os.path.join(tmp, "hf")
            export_hf(src, hf, dtype=dtype, registry=reg, family=family, trust_pickle=trust_pickle,
                      rope_scaling=rope_scaling, iteration=iteration)
            yield hf, read_json_object(os.path.join(hf, "config.json"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return RunnableModel(opened.hf_cfg, folder, ignore_config_keys)


def quantize(src: str | os.PathLike[str], out: str | os.PathLike[str], *, algo: str, tp: int = 1, pp: int = 1,
             calib_data: str | os.PathLike[str] | None = None,
             calib_size: int | None = None, calib_seq_len: int | None = None, calib_batch_size: int = 4,
             kv_cache: str = "none",
             compress: bool = False, device: str | torch.device = "cpu", overwrite: bool = False,
             group_size: int = DEFAULT_GROUP_SIZE, dtype: str | torch.dtype | None = None,
             family: str | None = None, awq_grid: int = 20, progress: Progress | None = None,
             registry: Registry | None = None, trust_pickle: bool = False,
             workers: Workers = SINGLE, rope_scaling: bool = True,
             ignore_config_keys: tuple[str, ...] = (), ep: int = 1, iteration: int | None = None) -> QuantizeReport:
    """Write a TensorRT-LLM checkpoint (``.qnemo``) of ``src`` through the ``trtllm`` output
    target. ``src`` is an HF folder, a ``.nemo``, a NeMo 2 folder or a Megatron-Bridge /
    Megatron-LM directory (``iteration`` picks its ``iter_XXXXXXX/``, as for ``reshard``); the
    output is the one ``reshard`` to a ``.nemo`` and ``quantize`` of that would write. A
    training checkpoint is refused: ``from-ckpt`` first.

    :param algo: ``none`` (plain checkpoint in the model dtype), ``int8_wo``, ``int4_wo``,
        ``fp8`` or ``int4_awq``.
    :param tp: tensor-parallel size of the TensorRT-LLM checkpoint; ``pp`` pipeline size.
    :param ep: expert-parallel size within TP, for a mixture of experts: each TP rank holds
        ``1/ep`` of a layer's experts, each split over ``tp/ep`` ranks (TensorRT-LLM's
        ``moe_ep_size`` and ``moe_tp_size``); must divide ``tp`` and the expert count.
    :param calib_data: text file, one calibration sample per line (default: the built-in
        English sample); ``calib_size`` rows of ``calib_seq_len`` tokens are used. Either left
        None is sized to the model and the device
        (:func:`nemo_convert.qnemo.calibration.calibration_size`: 64 × 512 on CUDA, a few
        rows of up to 256 tokens on the CPU); the report's ``calibration`` says what ran.
    :param kv_cache: ``"fp8"`` adds an FP8 KV-cache scale per attention (calibrated).
    :param compress: write a plain tar instead of a folder.
    :param device: where calibration and the quantization math run (``cpu`` / ``cuda``).
    :param group_size: int4 group size (64 or 128).
    :param dtype: checkpoint dtype (``bf16``/``fp16``/``fp32``); default: the source's.
    :param rope_scaling: for a ``.nemo`` that NeMo wrote, False reads ``scale_positional_embedding:
        True`` as no RoPE scaling (as ``export_hf(rope_scaling=False)``); its config is completed
        as export completes it (:mod:`nemo_convert.convert.export_config`).
    :param ignore_config_keys: for an HF source, ``config.json`` keys translated as if absent,
        as ``import_hf(ignore_config_keys=...)``: the TensorRT-LLM config is computed from
        the NeMo config ``import`` would write.
    :param workers: the processes sharing the work (torchrun): rank file ``i`` is written
        by process ``i mod world``, calibration runs in process 0 and its statistics are
        shared, process 0 writes the rest; the output is byte-identical to one process's.
    """
    t0 = time.perf_counter()
    src, out = os.fspath(src), os.fspath(out)
    calib_data = None if calib_data is None else os.fspath(calib_data)
    progress = progress or NoProgress()
    reg = registry if registry is not None else get_registry()
    keys = tuple(ignore_config_keys)

    def prepare() -> tuple[_Opened, torch.device, torch.dtype | None, OutputTarget]:
        dev, want_dtype, target = _check_options(src, out, reg, algo=algo, kv_cache=kv_cache, device=device,
                                                 dtype=dtype, overwrite=overwrite, compress=compress,
                                                 workers=workers)
        return _open(src, reg, family=family, trust_pickle=trust_pickle, rope_scaling=rope_scaling,
                     ignore_config_keys=keys, iteration=iteration), dev, want_dtype, target

    opened, dev, want_dtype, target = workers.run_all(prepare, undo=lambda r: r[0].close())
    settings = QuantSettings(algo, kv_cache=kv_cache, group_size=group_size, dtype=want_dtype, device=dev,
                             calib_data=calib_data, calib_size=calib_size, calib_seq_len=calib_seq_len,
                             calib_batch_size=calib_batch_size, awq_grid=awq_grid)
    try:
        job = OutputJob("quantize", out, opened.cfg, opened.plan, opened.source, opened.fam, opened.kinds,
                        reg.strategies(), reg.providers(), tp=tp, pp=pp, ep=ep, packed=compress, overwrite=overwrite,
                        progress=progress, workers=workers, tokenizer=lambda: opened.tok_files,
                        warnings=list(opened.warnings), rope_scaling=rope_scaling, quantization=settings,
                        model=_runnable(src, opened, reg, trust_pickle=trust_pickle, rope_scaling=rope_scaling,
                                        ignore_config_keys=keys, iteration=iteration))
        stats, _ = write_output(target, job)
    finally:
        opened.close()
    if not isinstance(stats, QuantStats):
        raise TypeError(f"output target {target.name!r} returned {type(stats).__name__}, not the qnemo writer's "
                        "QuantStats")
    return QuantizeReport(out, opened.fam.name, algo, stats.quant_algo, stats.kv_cache_quant_algo, stats.dtype, tp,
                          pp, stats.files, stats.tensors, stats.bytes, time.perf_counter() - t0, compress,
                          stats.calibration, job.dropped, job.warnings + stats.warnings, job.notes, ep)
