"""Key-path differences between two JSON-like configs, and HF configs compared by meaning."""

from __future__ import annotations

import copy
import inspect
import logging
import math
import warnings
from typing import Any

from nemo_convert.hf_config import Rope, hf_dtype_name, read_layer_ropes, read_rope
from nemo_convert.verify.report import ConfigDiff

#: Keys that spell one fact several ways across transformers versions, by the fact.
_SPELLINGS: dict[str, tuple[str, ...]] = {
    "dtype": ("torch_dtype", "dtype"),
    "rope": ("rope_theta", "rope_scaling", "rope_parameters", "rope_local_base_freq"),
}
#: config.json keys a NeMo config does not record, so that a config completed from a
#: NeMo-native ``.nemo`` cannot know them: compared only as notes.
NOT_IN_NEMO = ("transformers_version", "architectures", "_name_or_path", "bos_token_id", "eos_token_id",
               "pad_token_id")


def _same_scalar(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (math.isnan(a) and math.isnan(b))  # 1 == 1.0; NaN == NaN
    return type(a) is type(b) and a == b


def diff_config(a: Any, b: Any, path: str = "") -> list[ConfigDiff]:
    """Every key path where ``a`` and ``b`` differ (``rope_scaling.factor``,
    ``architectures[0]``), in ``a``'s key order then ``b``'s extra keys."""
    out: list[ConfigDiff] = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            sub = f"{path}.{k}" if path else str(k)
            if k not in b:
                out.append(ConfigDiff(sub, "missing_b", a[k], None))
            elif k not in a:
                out.append(ConfigDiff(sub, "missing_a", None, b[k]))
            else:
                out.extend(diff_config(a[k], b[k], sub))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            out.extend(diff_config(x, y, f"{path}[{i}]"))
        return out
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        if a != b:
            out.append(ConfigDiff(path or "(root)", "changed", a, b))
        return out
    if not _same_scalar(a, b):
        out.append(ConfigDiff(path or "(root)", "changed", a, b))
    return out


def _ropes(cfg: dict[str, Any]) -> dict[str, Rope]:
    """The RoPE of each layer kind (``""``: one for every layer), however the config spells it."""
    kinds = read_layer_ropes(cfg)
    return kinds if kinds is not None else {"": read_rope(cfg)}


def _rope_facts(a: dict[str, Any], b: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``rope_theta`` and ``rope_scaling`` (None: no scaling) of each side, per layer kind
    (``rope_theta[sliding_attention]``) where either side gives its layer kinds RoPEs of their
    own; a side with one RoPE for every layer has it on each of the other side's kinds."""
    ra, rb = _ropes(a), _ropes(b)
    if list(ra) == [""] and list(rb) != [""]:
        ra = dict.fromkeys(rb, ra[""])
    elif list(rb) == [""] and list(ra) != [""]:
        rb = dict.fromkeys(ra, rb[""])

    def facts(ropes: dict[str, Rope]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind, rope in sorted(ropes.items()):
            at = f"[{kind}]" if kind else ""
            out["rope_theta" + at] = rope.theta
            out["rope_scaling" + at] = ({"rope_type": rope.kind, **rope.params}
                                        if rope.kind != "default" or rope.params else None)
        return out

    fa, fb = facts(ra), facts(rb)
    return ({k: fa.get(k) for k in list(fa) + [k for k in fb if k not in fa]},
            {k: fb.get(k) for k in list(fa) + [k for k in fb if k not in fa]})


def _by_meaning(a: dict[str, Any], b: dict[str, Any]) -> list[ConfigDiff]:
    """Take the keys that the two configs spell differently (``torch_dtype`` / ``dtype``;
    ``rope_theta`` + ``rope_scaling`` (+ ``rope_local_base_freq``) / ``rope_parameters``, one
    block or one per layer kind) out of ``a`` and ``b`` and compare what they mean instead:
    ``dtype``, ``rope_theta``, ``rope_scaling`` (None: no scaling), per layer kind where the
    layers' RoPEs differ by kind (:func:`_rope_facts`). Keys spelled alike stay, for
    :func:`diff_config`; null is absent."""
    out: list[ConfigDiff] = []
    for fact, keys in _SPELLINGS.items():
        for k in keys:
            if a.get(k) is None and b.get(k) is None:  # null or absent: not set either way
                a.pop(k, None)
                b.pop(k, None)
        if [k for k in keys if k in a] == [k for k in keys if k in b] and (
                fact != "rope" or (read_layer_ropes(a) is None) == (read_layer_ropes(b) is None)):
            continue  # spelled alike (one RoPE block, or one per layer kind, on both sides)
        facts_a, facts_b = ({"dtype": hf_dtype_name(a)}, {"dtype": hf_dtype_name(b)}) if fact == "dtype" \
            else _rope_facts(a, b)
        for k in keys:
            a.pop(k, None)
            b.pop(k, None)
        for key, va in facts_a.items():
            vb = facts_b[key]
            if va is None or vb is None:
                if va is not vb:
                    out.append(ConfigDiff(key, "changed" if fact == "rope" else
                                          ("missing_b" if vb is None else "missing_a"), va, vb))
            else:
                out.extend(diff_config(va, vb, key))
    return out


_ABSENT = object()


def _config_class(cfg: dict[str, Any]) -> Any:
    """The installed transformers' config class for ``cfg``'s ``model_type`` (its local
    ``CONFIG_MAPPING``: nothing is downloaded), or None."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        return None
    try:
        from transformers import CONFIG_MAPPING
        return CONFIG_MAPPING[model_type]
    except (ImportError, KeyError, ValueError):
        return None


def _read_as_transformers(cls: Any, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The attributes ``cls`` holds after reading ``cfg`` (``from_dict``: defaults filled in,
    derived keys derived, older spellings converted), or None where it refuses the config."""
    log = logging.getLogger("transformers")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return dict(vars(cls.from_dict(copy.deepcopy(cfg))))
    except Exception:  # noqa: BLE001 - a config the class refuses is compared key by key instead
        return None
    finally:
        log.setLevel(level)


def _class_reads(cls: Any, key: str) -> bool:
    """Whether ``cls`` (or a config base class above it) reads ``key`` or derives it itself:
    takes it as an argument or a field, or names it in its source, as a string
    (``kwargs.get("sliding_window_pattern", 6)``) or as an attribute it sets
    (``self._sliding_window_pattern = ...``); rather than a key it only stores."""
    for c in cls.__mro__:
        if c is object:
            continue
        if key in getattr(c, "__annotations__", {}) or key in inspect.signature(c.__init__).parameters:
            return True
        try:
            source = inspect.getsource(c)
        except (OSError, TypeError):
            continue
        if f'"{key}"' in source or f"'{key}'" in source or f"self.{key} =" in source:
            return True
    return False


def _same_read(x: Any, y: Any) -> bool:
    try:
        return not diff_config(x, y)
    except Exception:  # noqa: BLE001 - objects that are not JSON-like: by equality
        return bool(x == y)


def _reads_same_without(cls: Any, cfg: dict[str, Any], read: dict[str, Any], keys: list[str]) -> bool:
    """Whether ``cls`` reads ``cfg`` without ``keys`` as it reads it with them (``read``), but
    for those keys."""
    without = _read_as_transformers(cls, {k: v for k, v in cfg.items() if k not in keys})
    return without is not None and _same_read({k: v for k, v in read.items() if k not in keys},
                                              {k: v for k, v in without.items() if k not in keys})


def _alike_as_read(diffs: list[ConfigDiff], a: dict[str, Any], b: dict[str, Any]) -> tuple[list[ConfigDiff], list[str]]:
    """Take out of ``diffs`` the top-level keys that the installed transformers reads alike on
    both sides (the config class of their common ``model_type``, :func:`_read_as_transformers`):

    * a key both sides state, differently, that the class reads to one value (Qwen2's
      ``sliding_window`` that ``use_sliding_window: false`` makes None on both), or a private
      record (below) that each side reads the same without;
    * a key one side states, where the side without it reads it as the value the other side
      states (a default of the class or a value it derives from the other keys:
      ``use_bidirectional_attention: false``, Gemma 3's ``bos_token_id: 2``, transformers 5's
      ``layer_types``);
    * a key one side states that the class reads or derives itself (:func:`_class_reads`)
      and that changes nothing there: that side reads the same without it (and without all
      such keys together): an older spelling whose value the other keys imply (Gemma 3's
      ``sliding_window_pattern: 6`` with the default pattern), or a private record (``_``) of
      a value the class derives and never reads back (transformers 5's
      ``_sliding_window_pattern`` beside ``layer_types``), which the other side's reading may
      hold at another value (its default) without consequence. A public key (a token id) the
      other side reads otherwise is not taken out this way: its readers are outside the class.

    A key the class only stores (one it does not read), or one the two sides read otherwise
    (a changed window, a token id other than the default, ``use_bidirectional_attention: true``),
    stays a difference; so does everything where the class is unknown or refuses either side.
    Returns the diffs kept and the keys taken out."""
    top = [d for d in diffs if "." not in d.path and "[" not in d.path]
    cls = _config_class(a) if top else None
    if cls is None or _config_class(b) is not cls:
        return diffs, []
    read_a, read_b = _read_as_transformers(cls, a), _read_as_transformers(cls, b)
    if read_a is None or read_b is None:
        return diffs, []
    alike: list[str] = []
    implied: dict[str, list[str]] = {"missing_a": [], "missing_b": []}  # alike by reading without them
    for d in top:
        key = d.path
        if d.kind == "changed":
            same = key in read_a and key in read_b and _same_read(read_a[key], read_b[key])
            if not same and key.startswith("_") and _class_reads(cls, key):  # a private record both write
                same = all(_reads_same_without(cls, side, read, [key]) for side, read in ((a, read_a), (b, read_b)))
        else:
            has, read_has, read_lacks = (a, read_a, read_b) if d.kind == "missing_b" else (b, read_b, read_a)
            same = key in read_lacks and key in read_has and _same_read(read_has[key], read_lacks[key])
            if not same and (key not in read_lacks or key.startswith("_")):
                same = _class_reads(cls, key) and _reads_same_without(cls, has, read_has, [key])
                if same:
                    implied[d.kind].append(key)
        if same:
            alike.append(key)
    for has, read_has, kind in ((a, read_a, "missing_b"), (b, read_b, "missing_a")):
        keys = implied[kind]
        if len(keys) > 1 and not _reads_same_without(cls, has, read_has, keys):  # together too
                alike = [k for k in alike if k not in keys]
    return [d for d in diffs if d.path not in alike], alike


def compare_hf_configs(a: dict[str, Any], b: dict[str, Any], *, native_a: bool = False,
                       native_b: bool = False) -> tuple[list[ConfigDiff], list[str]]:
    """The differences of two ``config.json``s by meaning, and notes.

    Spellings of one fact that differ between the sides (transformers 4 and 5) are
    compared by what they mean. When a side was completed from a NeMo-native config
    (``native_a`` / ``native_b``), what that config cannot know is a note, not a
    difference: a key only one side has, and the keys of :data:`NOT_IN_NEMO`. A value
    that both sides have and that differs (sizes, heads, eps, RoPE base or scaling)
    stays a difference.
    """
    source_a, source_b = a, b
    a, b = dict(a), dict(b)
    diffs, alike = _alike_as_read(_by_meaning(a, b) + diff_config(a, b), source_a, source_b)
    type_name = getattr(_config_class(source_a), "__name__", "") if alike else ""
    read = [(f"config: {', '.join(alike)} written differently (or on one side only) but read alike by "
             f"transformers' {type_name} (its defaults, or values the other keys imply)")] if alike else []
    if not (native_a or native_b):
        return diffs, read
    kept: list[ConfigDiff] = []
    unknown: list[str] = []
    for d in diffs:
        top = d.path.split(".", 1)[0].split("[", 1)[0]
        one_sided = d.kind != "changed" and top not in ("rope_theta", "rope_scaling")
        if top in NOT_IN_NEMO or one_sided:
            if d.kind == "changed" or (d.b if d.kind == "missing_a" else d.a) is not None:  # null: no fact
                unknown.append(d.path)
        else:
            kept.append(d)
    side = "A and B were" if native_a and native_b else ("A was" if native_a else "B was")
    notes = read + ([(f"config: {', '.join(unknown)} not compared ({side} completed from a NeMo config, "
                      "which does not record them)")] if unknown else [])
    return kept, notes
