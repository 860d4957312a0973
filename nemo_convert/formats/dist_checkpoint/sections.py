"""Tensors a distributed checkpoint stores as several keys, one per section.

Megatron-Core saves some tensors of its Mamba mixer cut into named dim-0 sections, each
under its own key with its TP-global shape (0.16.1 ``ssm/mamba_mixer.py``
``sharded_state_dict``, lines 1098–1184, through ``_split_tensor_factory``, lines
1187–1244, which appends ``.<section>`` to the key): ``…mixer.in_proj.weight`` is stored as
``…in_proj.weight.z``, ``.x``, ``.B``, ``.C``, ``.dt``, and ``…mixer.conv1d.weight`` /
``.bias`` as ``….x``, ``.B``, ``.C``. On load the factory's merge concatenates the rank's
parts again (``sh_ten_merge_fn``, line 1239). NeMo 2's own reader joins them the same way
(NVIDIA/NeMo ``nemo/collections/llm/gpt/model/ssm.py`` lines 111–152, ``dist_ckpt_handler``).

The logical tensor is the module's parameter, whole (``[z; x; B; C; dt]`` at TP 1); its
tensor-parallel kind, :class:`~nemo_convert.mapping.rules.Sections`, names the sections and
their sizes, so the writer splits by it (:func:`section_infos`, :func:`section_parts`) and a
reader joins by it (:class:`SectionsView`, :func:`join_sections`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping as TMapping, Sequence

from nemo_convert.errors import ShapeError
from nemo_convert.mapping.rules import Sections
from nemo_convert.tensors.base import TensorInfo, TensorSource
from nemo_convert.tensors.pieces import Lazy, materialize, rows

if TYPE_CHECKING:
    import torch


def section_key(name: str, section: str) -> str:
    """The key of one section of ``name`` (Megatron-Core's ``f"{key}.{split_name}"``)."""
    return f"{name}.{section}"


def sectioned(kinds: TMapping[str, object]) -> dict[str, Sections]:
    """The tensors of ``kinds`` (name → tensor-parallel kind) that are stored in sections."""
    return {k: v for k, v in kinds.items() if isinstance(v, Sections)}


def section_infos(infos: Sequence[TensorInfo], sections: TMapping[str, Sections]) -> list[TensorInfo]:
    """``infos`` with every sectioned tensor replaced by its sections, in order."""
    out: list[TensorInfo] = []
    for info in infos:
        kind = sections.get(info.name)
        if kind is None:
            out.append(info)
            continue
        if not info.shape or info.shape[0] != kind.rows:
            raise ShapeError(f"{info.name}: shape {list(info.shape)} is not the sections "
                             f"{dict(zip(kind.names, kind.sizes))} ({kind.rows} rows)")
        out += [TensorInfo(section_key(info.name, s), (n, *info.shape[1:]), info.dtype_name)
                for s, _, n in kind.spans()]
    return out


def section_parts(name: str, tensor: Lazy, kind: Sections) -> list[tuple[str, Lazy]]:
    """The (key, rows) of every section of one tensor (views: only rows are picked)."""
    if tensor.shape[0] != kind.rows:
        raise ShapeError(f"{name}: {tensor.shape[0]} rows are not the sections {dict(zip(kind.names, kind.sizes))}")
    return [(section_key(name, s), tensor.narrow(0, start, n)) for s, start, n in kind.spans()]


class SectionsView:
    """``inner`` with every sectioned tensor stored as section keys presented whole, under
    its logical name, at the place of its first section; everything else is delegated. A
    tensor whose sections are not all stored (or that is stored whole) is left as it is."""

    def __init__(self, inner: TensorSource, sections: TMapping[str, Sections]) -> None:
        self._inner = inner
        have = set(inner.keys())
        self._joined: dict[str, list[str]] = {}
        for name, kind in sections.items():
            parts = [section_key(name, s) for s in kind.names]
            if name not in have and all(p in have for p in parts):
                self._joined[name] = parts
        first = {parts[0]: name for name, parts in self._joined.items()}
        hidden = {p for parts in self._joined.values() for p in parts[1:]}
        self._keys = [first.get(k, k) for k in inner.keys() if k not in hidden]
        self._kinds = dict(sections)

    def keys(self) -> list[str]:
        return list(self._keys)

    def info(self, key: str) -> TensorInfo:
        parts = self._joined.get(key)
        if parts is None:
            return self._inner.info(key)
        infos = [self._inner.info(p) for p in parts]
        kind = self._kinds[key]
        head = infos[0]
        for p, i, n in zip(parts, infos, kind.sizes):
            if tuple(i.shape[1:]) != tuple(head.shape[1:]) or i.dtype_name != head.dtype_name or i.shape[0] != n:
                raise ShapeError(f"{p}: shape {list(i.shape)} {i.dtype_name} does not fit the sections of {key} "
                                 f"({dict(zip(kind.names, kind.sizes))} rows, each {list(head.shape[1:])} "
                                 f"{head.dtype_name})")
        return TensorInfo(key, (sum(i.shape[0] for i in infos), *head.shape[1:]), head.dtype_name)

    def load(self, key: str) -> torch.Tensor:
        return materialize(self.load_lazy(key))

    def load_lazy(self, key: str) -> Lazy:
        """:meth:`load`, deferred: the sections as pieces of one tensor."""
        parts = self._joined.get(key)
        load = getattr(self._inner, "load_lazy", self._inner.load)
        if parts is None:
            return load(key)
        self.info(key)  # the sections fit together
        return rows([load(p) for p in parts])

    def group(self, key: str) -> str:
        parts = self._joined.get(key)
        return self._inner.group(parts[0] if parts else key)

    def close(self) -> None:
        self._inner.close()

    @property
    def extra_state_keys(self) -> list[str]:
        return list(getattr(self._inner, "extra_state_keys", []))


def join_sections(source: TensorSource, kinds: TMapping[str, object]) -> TensorSource:
    """``source`` with the sectioned tensors of ``kinds`` joined (:class:`SectionsView`);
    ``source`` itself when there are none."""
    sections = sectioned(kinds)
    return SectionsView(source, sections) if sections else source
