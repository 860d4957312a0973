"""Completing a ``model_config.yaml`` with the runtime keys NeMo's model class reads.

NeMo restores a ``.nemo`` by building its model class from ``model_config.yaml`` in
OmegaConf *struct* mode, where reading a missing key by attribute raises, so a config that
only describes the architecture does not restore (:mod:`nemo_convert.families.nemo_runtime`
has the keys and their sources). :func:`complete_nemo_config` adds every such key a config
lacks and never changes a value it has, so a family's own keys win at import and a
resharded or training checkpoint keeps what it had.

Which keys a class needs: the family's own declaration for its class
(``NemoTarget.runtime_defaults``, e.g. CLIP's ``MegatronCLIPModel``), else NeMo's shared
classes (``MegatronGPTModel``), else the Megatron base for any other ``…Megatron*`` class.
No family is named here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from nemo_convert.families.nemo_runtime import SHARED_DEFAULTS, RuntimeDefaults, megatron_base_defaults

#: Sections added whole or not at all: merging defaults into a source's own optimizer
#: (say, a scheduler it does not have) would change its meaning.
ATOMIC_SECTIONS = frozenset({"optim"})

#: NeMo class → its runtime defaults, as the families declare them (``Registry.nemo_runtime_defaults``).
Declared = Mapping[str, RuntimeDefaults]


def declared_by(nemo: Any) -> dict[str, RuntimeDefaults]:
    """What a family's NeMo side (``ModelFamily.nemo``) declares: its class → its defaults."""
    make = getattr(nemo, "runtime_defaults", None)
    return {nemo.target: make} if make is not None else {}


def defaults_for(target: str | None, declared: Declared) -> RuntimeDefaults | None:
    """The defaults of NeMo class ``target``: a family's declaration for it, NeMo's shared
    class's, the Megatron base for any other ``…Megatron*`` class, None for a class we know
    nothing about."""
    if not target:
        return None
    if target in declared:
        return declared[target]
    if target in SHARED_DEFAULTS:
        return SHARED_DEFAULTS[target]
    if target.rsplit(".", 1)[-1].startswith("Megatron"):
        return megatron_base_defaults
    return None


def _fill(cfg: dict[str, Any], defaults: Mapping[str, Any], where: str, added: list[str]) -> None:
    for key, value in defaults.items():
        path = f"{where}{key}"
        if key not in cfg:
            cfg[key] = copy.deepcopy(value)
            added.append(path)
        elif isinstance(value, Mapping) and isinstance(cfg[key], dict) and key not in ATOMIC_SECTIONS:
            _fill(cfg[key], value, path + ".", added)


def complete_nemo_config(cfg: dict[str, Any], declared: Declared) -> list[str]:
    """Add, in place, every default key of ``cfg['target']`` that ``cfg`` lacks (inside
    existing sections too, except :data:`ATOMIC_SECTIONS`); never change a value ``cfg``
    has, ``None`` included. Returns the dotted paths added."""
    make = defaults_for(cfg.get("target") if isinstance(cfg.get("target"), str) else None, declared)
    added: list[str] = []
    if make is not None:
        _fill(cfg, make(cfg), "", added)
    return added


def _known_target(cfg: Mapping[str, Any], declared: Declared) -> bool:
    return defaults_for(cfg.get("target") if isinstance(cfg.get("target"), str) else None, declared) is not None


def restore_warnings(cfg: dict[str, Any], declared: Declared,
                     family_warnings: Callable[[dict[str, Any]], list[str]] | None = None) -> list[str]:
    """One line for each thing NeMo's ``restore_from`` loads from outside the ``.nemo`` to
    build the model ``cfg`` describes: what the family's NeMo class loads so
    (``family_warnings``, its ``NemoTarget.restore_warnings``: NeVA's vision tower named by
    hub id or folder), then a Hugging Face tokenizer named so (NeMo resolves neither inside
    the archive)."""
    if not _known_target(cfg, declared):
        return []
    out: list[str] = list(family_warnings(cfg)) if family_warnings is not None else []
    tok = cfg.get("tokenizer")
    if isinstance(tok, Mapping) and tok.get("library") == "huggingface":
        out.append(f"tokenizer: NeMo builds a Hugging Face tokenizer from tokenizer.type={tok.get('type')!r} "
                   "(a hub id it needs online or in the HF cache, or a folder that must still exist), not from "
                   "the tokenizer files packed in the .nemo; see 'Compatibility with NeMo' in docs/formats.md")
    return out


def restore_notes(cfg: Mapping[str, Any], declared: Declared) -> list[str]:
    """What keeps NeMo from restoring the ``.nemo`` at all, for the report's notes: no
    tokenizer section (NeMo sizes a Megatron model's vocabulary from its tokenizer)."""
    if _known_target(cfg, declared) and not isinstance(cfg.get("tokenizer"), Mapping):
        return ["no tokenizer files in the source, so the .nemo has no tokenizer section; NeMo sizes a Megatron "
                "model's vocabulary from its tokenizer and cannot restore the file without one"]
    return []
