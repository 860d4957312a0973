"""Stand-ins for classes a checkpoint pickles but the tests do not install: OmegaConf.

``fake_omegaconf()`` registers classes under OmegaConf 2.x's module names whose pickles
have OmegaConf's layout (``_metadata`` / ``_parent`` / ``_content``; value nodes ``_val``;
``Metadata.resolver_cache``; ``_flags_cache`` left out of the state), so a checkpoint can
hold a "DictConfig" without omegaconf installed; ``omegaconf_tree`` lays out a plain value
the way ``OmegaConf.create`` does.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import sys
import types
from collections.abc import Iterator
from typing import Any

#: OmegaConf's value-node classes (``omegaconf.nodes``).
VALUE_NODES = ("AnyNode", "StringNode", "IntegerNode", "FloatNode", "BooleanNode")
_TYPED_NODE = {str: "StringNode", int: "IntegerNode", float: "FloatNode", bool: "BooleanNode"}


class NoneDict:
    """Marks a ``DictConfig`` whose content is ``None`` (OmegaConf's value of an
    ``Optional[Dict]`` field set to ``None``); it reads back as ``None``."""


NONE_DICT = NoneDict()


#: The modules :func:`fake_omegaconf` stands in for.
OMEGACONF_MODULES = ("omegaconf", "omegaconf.base", "omegaconf.nodes", "omegaconf.dictconfig", "omegaconf.listconfig")


def omegaconf_modules() -> dict[str, Any]:
    """What ``sys.modules`` holds under OmegaConf's names now (a real OmegaConf may be
    imported): compare before and after to prove that nothing was left or imported."""
    return {n: sys.modules[n] for n in OMEGACONF_MODULES if n in sys.modules}


@contextlib.contextmanager
def fake_omegaconf() -> Iterator[dict[str, type]]:
    """``{class name: class}`` of the stand-ins, registered in ``sys.modules`` while the
    context is open (whatever was there before is put back)."""

    @dataclasses.dataclass
    class Metadata:
        ref_type: Any
        object_type: Any
        optional: bool
        key: Any
        flags: Any = None
        flags_root: bool = False
        resolver_cache: Any = dataclasses.field(default_factory=lambda: collections.defaultdict(dict))

    @dataclasses.dataclass
    class ContainerMetadata(Metadata):
        key_type: Any = None
        element_type: Any = None

    class Node:
        def __init__(self, parent: Any, metadata: Any, **fields: Any) -> None:
            self.__dict__.update(_metadata=metadata, _parent=parent, _flags_cache=None, **fields)

        def __getstate__(self) -> dict[str, Any]:
            state = dict(self.__dict__)
            del state["_flags_cache"]
            return state

    members: dict[str, list[type]] = {
        "omegaconf.base": [Metadata, ContainerMetadata],
        "omegaconf.nodes": [type(n, (Node,), {}) for n in VALUE_NODES],
        "omegaconf.dictconfig": [type("DictConfig", (Node,), {})],
        "omegaconf.listconfig": [type("ListConfig", (Node,), {})]}
    saved = {name: sys.modules.get(name) for name in ["omegaconf", *members]}
    classes: dict[str, type] = {}
    sys.modules["omegaconf"] = types.ModuleType("omegaconf")
    for module, clss in members.items():
        mod = types.ModuleType(module)
        for cls in clss:
            cls.__module__, cls.__qualname__ = module, cls.__name__
            setattr(mod, cls.__name__, cls)
            classes[cls.__name__] = cls
        sys.modules[module] = mod
    try:
        yield classes
    finally:
        for name, saved_mod in saved.items():
            if saved_mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = saved_mod


def omegaconf_tree(classes: dict[str, type], value: Any, parent: Any = None, key: Any = None, *,
                   typed: bool = False) -> Any:
    """``value`` as OmegaConf lays out ``OmegaConf.create(value)``: untyped (``AnyNode``
    leaves), or with ``typed`` as a structured config stores them (``StringNode``,
    ``IntegerNode``, …; interpolations and ``???`` stay ``AnyNode``). :data:`NONE_DICT`
    becomes a ``DictConfig`` with no content."""
    if isinstance(value, (dict, list, NoneDict)):
        kind = "ListConfig" if isinstance(value, list) else "DictConfig"
        meta = classes["ContainerMetadata"](ref_type=Any, object_type=list if kind == "ListConfig" else dict,
                                            optional=True, key=key, flags={}, key_type=Any, element_type=Any)
        node = classes[kind](parent, meta, _content=None)
        if isinstance(value, dict):
            node._content = {k: omegaconf_tree(classes, v, node, k, typed=typed) for k, v in value.items()}
        elif isinstance(value, list):
            node._content = [omegaconf_tree(classes, v, node, i, typed=typed) for i, v in enumerate(value)]
        return node
    kind = _TYPED_NODE.get(type(value), "AnyNode") if typed else "AnyNode"
    if isinstance(value, str) and value.startswith(("${", "???")):
        kind = "AnyNode"
    meta = classes["Metadata"](ref_type=Any, object_type=None, optional=True, key=key, flags={})
    return classes[kind](parent, meta, _val=value)


__all__ = ["NONE_DICT", "VALUE_NODES", "NoneDict", "fake_omegaconf", "omegaconf_tree"]
