"""The model config of a training checkpoint: from its ``hyper_parameters`` or a Lightning
``hparams.yaml`` (read with a safe loader), and made plain YAML-ready data for the ``.nemo``."""

from __future__ import annotations

import copy
import os
from typing import Any

import yaml

from nemo_convert.errors import ConfigError, InputError
from nemo_convert.formats.ptl.ptl_ckpt import Located, TrainingCheckpoint

#: Fields that only a model config has: a flat ``hparams.yaml`` or hyper-parameters dict
#: holding one of these is taken as the config itself.
MODEL_CONFIG_HINTS = ("target", "num_layers", "hidden_size", "encoder_seq_length", "mcore_gpt")


def _pick_config(obj: Any) -> dict[str, Any] | None:
    """The model config in a hyper-parameters dict: ``cfg`` (NeMo's ModelPT), a ``model:``
    wrapper, or a flat model config."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("cfg"), dict):
        obj = obj["cfg"]
    if isinstance(obj.get("model"), dict) and not any(k in obj for k in MODEL_CONFIG_HINTS):
        obj = obj["model"]
    if any(k in obj for k in MODEL_CONFIG_HINTS):
        return copy.deepcopy(obj)
    return None


class _HparamsLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``!!python/tuple`` (which PyYAML's ``dump`` writes
    for tuples in Lightning's ``hparams.yaml``) as a list; every other tag that would build a
    Python object is refused by name."""


def _tuple_as_list(loader: yaml.SafeLoader, node: yaml.Node) -> list[Any]:
    return loader.construct_sequence(node, deep=True)  # type: ignore[arg-type]


def _refuse_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    raise InputError(f"YAML tag {node.tag!r} would build a Python object; nemo-convert reads YAML safely "
                     "and refuses it")


_HparamsLoader.add_constructor("tag:yaml.org,2002:python/tuple", _tuple_as_list)
_HparamsLoader.add_multi_constructor("tag:yaml.org,2002:python/", _refuse_tag)


def read_hparams(path: str) -> dict[str, Any]:
    """The model config of a Lightning ``hparams.yaml`` (``cfg:`` key), read as plain data
    (a safe loader: no tag can import or call anything)."""
    try:
        with open(path, "rb") as f:
            data = yaml.load(f.read().decode("utf-8"), Loader=_HparamsLoader)
    except FileNotFoundError:
        raise InputError(f"{path}: no such hparams file") from None
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: not a safe YAML file ({first})") from None
    cfg = _pick_config(data)
    if cfg is None:
        keys = ", ".join(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"{path}: no model config (expected a 'cfg:' section; found {keys})")
    return cfg


_YAML_SCALARS = (str, int, float, bool, type(None))


def yaml_ready(value: Any, where: str, odd: list[str]) -> Any:
    """``value`` as data ``yaml.safe_dump`` writes: tuples and sets become lists, numpy
    scalars and arrays Python numbers and lists; anything else (a tensor, an object a
    trusted pickle built) becomes its ``repr``, with its path appended to ``odd``."""
    if isinstance(value, _YAML_SCALARS):
        return value
    if isinstance(value, dict):
        return {k if isinstance(k, _YAML_SCALARS) else str(k): yaml_ready(v, f"{where}.{k}", odd)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [yaml_ready(v, f"{where}[{i}]", odd) for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return [yaml_ready(v, f"{where}[]", odd) for v in sorted(value, key=repr)]
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return yaml_ready(value.tolist(), where, odd)
    odd.append(where)
    return repr(value)


def _hparams_near(loc: Located) -> list[str]:
    found = []
    for d in dict.fromkeys(loc.base_dirs + tuple(os.path.dirname(os.path.abspath(b)) for b in loc.base_dirs)):
        p = os.path.join(d, "hparams.yaml")
        if os.path.isfile(p):
            found.append(p)
    return found


def model_config(ck: TrainingCheckpoint, hparams: str | None) -> tuple[dict[str, Any], str]:
    """The model config and where it came from: ``hparams`` when given, else the
    checkpoint's ``hyper_parameters``."""
    if hparams is not None:
        return read_hparams(hparams), hparams
    cfg = _pick_config(ck.hyper_parameters)
    if cfg is not None:
        return cfg, "hyper_parameters.cfg"
    near = _hparams_near(ck.located)
    hint = f" (found {near[0]}; pass --hparams {near[0]})" if near else \
        " (pass --hparams with Lightning's hparams.yaml, whose 'cfg:' section is the model config)"
    what = "no hyper_parameters" if ck.hyper_parameters is None else "no model config in its hyper_parameters"
    raise ConfigError(f"{ck.located.path}: {what}{hint}")
