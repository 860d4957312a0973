"""Open any checkpoint we read as a ``.nemo`` would be: a ``.nemo`` (tar, gzipped tar,
unpacked folder; any layout), a NeMo 2.0 folder, or a Megatron-Bridge / Megatron-LM
checkpoint directory. The conversions that read NeMo-side checkpoints (``export``,
``reshard``, ``verify``, ``inspect``) open them through :func:`open_model_checkpoint`."""

from __future__ import annotations

from nemo_convert.errors import InputError
from nemo_convert.formats.megatron.megatron_dir import is_megatron_dir, open_megatron_dir
from nemo_convert.formats.nemo.nemo import KindsFor, NemoCheckpoint, open_nemo
from nemo_convert.formats.megatron.providers import ProviderTable
from nemo_convert.sharding.protocol import Strategies


def open_model_checkpoint(path: str, *, strategies: Strategies, providers: ProviderTable, trust_pickle: bool = False,
                          kinds_for: KindsFor | None = None, iteration: int | None = None) -> NemoCheckpoint:
    """:func:`~nemo_convert.formats.nemo.nemo.open_nemo`, or
    :func:`~nemo_convert.formats.megatron.megatron_dir.open_megatron_dir` for a Megatron directory
    (``iteration`` picks its ``iter_XXXXXXX/``; it is refused for anything else). Per-rank
    layouts are merged with ``strategies`` (the registry's: ``Registry.strategies()``); configs
    written as Megatron-Bridge providers are read with ``providers`` (``Registry.providers()``)."""
    if is_megatron_dir(path):
        return open_megatron_dir(path, strategies=strategies, providers=providers, iteration=iteration, trust_pickle=trust_pickle,
                                 kinds_for=kinds_for)
    if iteration is not None:
        raise InputError(f"{path}: --iteration applies to Megatron-Bridge / Megatron-LM checkpoint directories")
    return open_nemo(path, strategies=strategies, providers=providers, trust_pickle=trust_pickle, kinds_for=kinds_for)
