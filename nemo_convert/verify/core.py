"""``verify``: compare two checkpoints, in any formats we read, through the family mapping."""

from __future__ import annotations

import copy
import fnmatch
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Sequence

from nemo_convert.convert.common import SECTION, kinds_for, registry_or_default
from nemo_convert.convert.hf_quantized import dequantize_on_read
from nemo_convert.convert.nemo_to_hf import export_hf, plan_to_hf
from nemo_convert.errors import InputError, PluginError
from nemo_convert.formats.detect import require_kind
from nemo_convert.formats.hf.hf import HFCheckpoint, open_hf
from nemo_convert.formats.nemo.nemo import NemoCheckpoint
from nemo_convert.formats.open_any import open_model_checkpoint
from nemo_convert.mapping.rules import Specs
from nemo_convert.plugins.manager import Registry
from nemo_convert.plugins.records import DEFAULT_TOKENIZER_FILES, ModelFamily, Verifier
from nemo_convert.verify.configs import compare_hf_configs, diff_config
from nemo_convert.verify.report import (
    ConfigDiff,
    SideInfo,
    TensorDiff,
    VerifyReport,
)
from nemo_convert.verify.tensors import HFView, compare_tensors
from nemo_convert.verify.tokenizers import PROBE_TEXTS, compare_tokenizers



@dataclass
class _Side:
    info: SideInfo
    ckpt: HFCheckpoint | NemoCheckpoint
    view: HFView
    hf_config: dict[str, Any]
    family: ModelFamily | None
    tokenizer_files: dict[str, bytes]
    generation_config: dict[str, Any] | None
    tied: dict[str, str] = field(default_factory=dict)  # HF name -> the HF name it is tied to
    drops: list[str] = field(default_factory=list)  # HF globs that are not weights
    dropped: list[str] = field(default_factory=list)  # source tensors the to_hf plan leaves out
    warnings: list[str] = field(default_factory=list)  # completing a NeMo-native config
    native: bool = False  # hf_config was completed from a NeMo-native config (none recorded from HF)


def _mapping_facts(fam: ModelFamily, nemo_cfg: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Tied HF tensors and HF non-weight globs of the family, for this config."""
    tied: dict[str, str] = {}
    drops: list[str] = []
    specs = Specs(nemo_cfg)
    for part in fam.mapping(nemo_cfg).parts():
        ctx = part.context(nemo_cfg, specs)
        for rule in part.rules:
            if rule.applies(ctx):
                tied.update(rule.aliases(ctx))
        drops.extend(p.replace("{i}", "*") for p in part.drop_hf)
    return tied, drops


def _read_folder_files(folder: str, names: Sequence[str]) -> dict[str, bytes]:
    out = {}
    for n in names:
        p = os.path.join(folder, n)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                out[n] = f.read()
    return out


def _open_side(path: str, family: str | None, reg: Registry, trust_pickle: bool, rope_scaling: bool,
               drop_head: bool = False) -> _Side:
    if require_kind(path, ("hf", "nemo", "nemo2", "megatron"), "a Hugging Face folder or a .nemo").kind == "hf":
        hf = open_hf(path, trust_pickle=trust_pickle)
        try:
            _, dequantized = dequantize_on_read(hf)  # as import reads it: the plain model it encodes
            fam: ModelFamily | None
            try:
                fam = reg.family(family) if family else reg.family_for_hf_config(hf.config)
            except PluginError:
                if family:
                    raise
                fam = None
            side = _Side(SideInfo(path, "hf", None, fam.name if fam else None), hf, HFView(hf.source),
                         hf.config, fam,
                         _read_folder_files(path, fam.hf.tokenizer_files if fam else DEFAULT_TOKENIZER_FILES),
                         hf.generation_config, warnings=[dequantized] if dequantized else [])
            if fam is not None:
                try:
                    side.tied, side.drops = _mapping_facts(fam, fam.config_to_nemo(copy.deepcopy(hf.config)))
                except Exception:  # a config the family cannot translate: compare by names only
                    pass
            return side
        except BaseException:
            hf.close()
            raise
    ck = open_model_checkpoint(path, strategies=reg.strategies(), providers=reg.providers(), trust_pickle=trust_pickle,
                               kinds_for=kinds_for(reg, family))
    try:
        fam = reg.family(family) if family else reg.family_for_nemo_config(ck.config)
        native = not isinstance((ck.config.get(SECTION) or {}).get("hf_config"), dict)
        prep, hf_config, plan = plan_to_hf(ck, fam, rope_scaling=rope_scaling, drop_head=drop_head)  # as export
        cfg = prep.cfg
        tok_files = prep.tokenizer.files()  # what export writes (its warnings come with it)
        side = _Side(SideInfo(path, getattr(ck, "kind", "nemo"), ck.layout, fam.name), ck, HFView(prep.source, plan),
                     hf_config, fam, tok_files,
                     (cfg.get(SECTION) or {}).get("hf_generation_config"), dropped=list(plan.dropped),
                     warnings=list(getattr(ck, "warnings", [])) + prep.warnings + prep.notes
                     + prep.tokenizer.warnings, native=native)
        side.tied, side.drops = _mapping_facts(fam, cfg)
        source_quant = (cfg.get(SECTION) or {}).get("hf_dequantized")
        if isinstance(source_quant, dict):
            side.warnings.append(f"imported from a {source_quant.get('quant_method')} checkpoint, dequantized on "
                                 "import (its HF export is the plain model)")
        return side
    except BaseException:
        ck.close()
        raise


def _one_sided(name: str, present: _Side, other: _Side, a_present: bool, atol: float, rtol: float,
               allow_dtype_change: bool) -> TensorDiff:
    """A tensor only one side has: a tied copy, a non-weight, or really missing."""
    tied_to = present.tied.get(name) or other.tied.get(name)
    if tied_to and tied_to in other.view:
        x, y = present.view.load(name), other.view.load(tied_to)
        a, b = (x, y) if a_present else (y, x)
        d = compare_tensors(name, a, b, atol=atol, rtol=rtol, allow_dtype_change=allow_dtype_change)
        d.note = "; ".join(filter(None, [
            f"tied: {'B' if a_present else 'A'} has no {name}; compared with its {tied_to}", d.note]))
        return d
    info = present.view.info(name)
    shape, dtype = list(info.shape), str(info.dtype).replace("torch.", "")
    if any(fnmatch.fnmatchcase(name, g) for g in present.drops + other.drops):
        status, note = "skipped", "not a weight (the family drops it)"
    else:
        status, note = ("missing_b" if a_present else "missing_a"), None
    if a_present:
        return TensorDiff(name, status, shape_a=shape, dtype_a=dtype, note=note)
    return TensorDiff(name, status, shape_b=shape, dtype_b=dtype, note=note)


def _is_float_dtype_name(v: Any) -> bool:
    import torch

    d = getattr(torch, v, None) if isinstance(v, str) else None
    return isinstance(d, torch.dtype) and d.is_floating_point


def _dtype_changes(config: list[ConfigDiff]) -> tuple[list[ConfigDiff], list[ConfigDiff]]:
    """Split config differences into (changes of the ``dtype`` / ``torch_dtype`` key between
    floating dtypes, the others)."""
    dtype: list[ConfigDiff] = []
    other: list[ConfigDiff] = []
    for c in config:
        key = c.path.rsplit(".", 1)[-1]
        is_dtype = (key in ("dtype", "torch_dtype") and c.kind == "changed" and _is_float_dtype_name(c.a)
                    and _is_float_dtype_name(c.b))
        (dtype if is_dtype else other).append(c)
    return dtype, other


def _hf_folder(side: _Side, tmp: str, registry: Registry, trust_pickle: bool, rope_scaling: bool,
               drop_head: bool = False) -> str:
    if side.info.format == "hf":
        return side.info.path

    out = os.path.join(tmp, "b" if os.path.exists(os.path.join(tmp, "a")) else "a")
    export_hf(side.info.path, out, family=side.info.family, registry=registry, trust_pickle=trust_pickle,
              rope_scaling=rope_scaling, drop_head=drop_head)
    return out


def verify(a: str | os.PathLike[str], b: str | os.PathLike[str], *, atol: float = 0.0, rtol: float = 0.0,
           family: str | None = None,
           registry: Registry | None = None, trust_pickle: bool = False,
           clip_image: str | os.PathLike[str] | None = None, texts: Sequence[str] | None = None,
           probe_texts: Sequence[str] = PROBE_TEXTS, allow_dtype_change: bool = False,
           rope_scaling: bool = True, options: Mapping[str, Any] | None = None,
           drop_head: bool = False) -> VerifyReport:
    """Compare checkpoints ``a`` and ``b`` (HF folders or ``.nemo`` in any layout).

    Both sides are brought to HF tensor names (a ``.nemo`` is streamed through its
    family's ``to_hf`` plan, tensor by tensor); then every tensor is compared (bit
    equality, else ``|a - b| <= atol + rtol * |b|``), the HF configs are compared by meaning
    (:func:`~nemo_convert.verify.configs.compare_hf_configs`: transformers 4 and 5 spellings
    alike; what a NeMo-native config cannot know is a note), and the tokenizers are compared
    by vocab size and the encodings of a probe set.

    :param family: the model family of ``.nemo`` sides (default: from their config);
        for an HF side, default: detected from ``config.json`` (none needed).
    :param allow_dtype_change: compare tensors of different floating dtypes by value
        (both upcast; then ``atol``/``rtol`` apply) instead of counting the dtype change
        as a difference, and let the configs' ``dtype``/``torch_dtype`` differ (floating
        dtypes only). Every change is still listed (in the tensor notes and the report notes).
    :param rope_scaling: False: complete a NeMo-native ``scale_positional_embedding: True``
        without llama3 RoPE scaling, as ``export_hf(rope_scaling=False)`` does.
    :param drop_head: compare a NeMo-Aligner reward model's language model, its reward head
        left out (as ``export_hf(drop_head=True)``; without it such a side is refused).
    :param options: the options of plugin-provided verifiers (``nemo_convert_verifiers``),
        by key; each verifier with a given option runs on both sides (as HF folders) after
        the comparison, its result in ``VerifyReport.extra[name]`` (informational).
    :param clip_image: deprecated spelling of ``options={"clip_image": …}`` (with
        ``texts``: ``options={"texts": […]}``), the CLIP plugin's verifier options, from
        before verifiers were generic.
    :raises NemoConvertError: bad input (unreadable checkpoint, unknown family, …).
    """
    a, b = os.fspath(a), os.fspath(b)
    for label, v in (("atol", atol), ("rtol", rtol)):
        if not v >= 0:
            raise InputError(f"{label} must be a number >= 0, not {v}")
    given = dict(options or {})
    if clip_image is not None or texts is not None:
        warnings.warn("verify(clip_image=..., texts=...) is deprecated; pass options={'clip_image': ..., "
                      "'texts': [...]} (the CLIP plugin's verifier options)", DeprecationWarning, stacklevel=2)
        given.update({k: v for k, v in (("clip_image", clip_image), ("texts", texts)) if v is not None})
    reg = registry_or_default(registry)
    verifiers = _verifiers_for(reg, given)
    side_a = _open_side(a, family, reg, trust_pickle, rope_scaling, drop_head)
    try:
        side_b = _open_side(b, family, reg, trust_pickle, rope_scaling, drop_head)
    except BaseException:
        side_a.ckpt.close()
        raise
    try:
        rep = VerifyReport(side_a.info, side_b.info, float(atol), float(rtol), allow_dtype_change)
        names_b = set(side_b.view.names())
        for name in side_a.view.names():
            if name in names_b:
                ia, ib = side_a.view.info(name), side_b.view.info(name)
                if ia.shape != ib.shape:
                    rep.tensors.append(TensorDiff(name, "shape", list(ia.shape), list(ib.shape),
                                                  str(ia.dtype).replace("torch.", ""),
                                                  str(ib.dtype).replace("torch.", "")))
                    continue
                x, y = side_a.view.load(name), side_b.view.load(name)
                rep.tensors.append(compare_tensors(name, x, y, atol=atol, rtol=rtol,
                                                   allow_dtype_change=allow_dtype_change))
                del x, y
            else:
                rep.tensors.append(_one_sided(name, side_a, side_b, True, atol, rtol, allow_dtype_change))
        names_a = set(side_a.view.names())
        for name in side_b.view.names():
            if name not in names_a:
                rep.tensors.append(_one_sided(name, side_b, side_a, False, atol, rtol, allow_dtype_change))
        side_a.view.release()
        side_b.view.release()

        rep.config, rep.notes = compare_hf_configs(side_a.hf_config, side_b.hf_config, native_a=side_a.native,
                                                   native_b=side_b.native)
        ga, gb = side_a.generation_config, side_b.generation_config
        if ga is not None and gb is not None:
            rep.config += diff_config(ga, gb, "generation_config")
        elif (ga is None) != (gb is None):
            rep.notes.append(f"only {'A' if ga is not None else 'B'} has a generation config; not compared")
        if allow_dtype_change:
            changed: dict[tuple[str, str], int] = {}
            for t in rep.tensors:
                if t.status in ("close", "different") and t.dtype_a and t.dtype_b and t.dtype_a != t.dtype_b:
                    changed[(t.dtype_a, t.dtype_b)] = changed.get((t.dtype_a, t.dtype_b), 0) + 1
            for (da, db), n in changed.items():
                rep.notes.append(f"{n} tensor(s) changed dtype ({da} in A, {db} in B); compared by value "
                                 "(allow_dtype_change)")
            dtype_diffs, rep.config = _dtype_changes(rep.config)
            for c in dtype_diffs:
                rep.notes.append(f"config {c.path}: {c.a} in A, {c.b} in B (allow_dtype_change)")
        rep.tokenizer = compare_tokenizers(side_a.tokenizer_files, side_b.tokenizer_files, probe_texts)
        for label, s in (("A", side_a), ("B", side_b)):
            rep.notes += [f"{label}: {w}" for w in s.warnings]
            if s.dropped:
                rep.notes.append(f"{label}: {len(s.dropped)} tensor(s) that are not weights were not compared "
                                 f"({', '.join(s.dropped[:3])}{', …' if len(s.dropped) > 3 else ''})")
    finally:
        side_a.ckpt.close()
        side_b.ckpt.close()

    if verifiers:
        with tempfile.TemporaryDirectory(prefix="nemo-convert-verify-") as tmp:
            fa = _hf_folder(side_a, tmp, reg, trust_pickle, rope_scaling, drop_head)
            fb = _hf_folder(side_b, tmp, reg, trust_pickle, rope_scaling, drop_head)
            for verifier, opts in verifiers:
                rep.extra[verifier.name] = verifier.run(fa, fb, opts)
    return rep


def _verifiers_for(reg: Registry, given: dict[str, Any]) -> list[tuple[Verifier, dict[str, Any]]]:
    """The verifiers that read any of the ``given`` options, each with its own options
    (checked); an option no installed verifier reads is refused."""
    out: list[tuple[Verifier, dict[str, Any]]] = []
    claimed: set[str] = set()
    for p in reg.verifiers.values():
        keys = {o.key for o in p.record.options}
        mine = {k: v for k, v in given.items() if k in keys}
        claimed |= keys
        if mine:
            if p.record.check is not None:
                p.record.check(mine)
            out.append((p.record, mine))
    unknown = sorted(set(given) - claimed)
    if unknown:
        known = ", ".join(sorted(claimed)) or "none"
        raise InputError(f"no installed verifier reads the option(s) {', '.join(unknown)} (known: {known})")
    return out
