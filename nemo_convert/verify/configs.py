"""Key-path differences between two JSON-like configs, and HF configs compared by meaning."""

from __future__ import annotations

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
        return a == b or (a != a and b != b)  # 1 == 1.0; NaN == NaN
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
    a, b = dict(a), dict(b)
    diffs = _by_meaning(a, b) + diff_config(a, b)
    if not (native_a or native_b):
        return diffs, []
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
    notes = [f"config: {', '.join(unknown)} not compared ({side} completed from a NeMo config, "
             "which does not record them)"] if unknown else []
    return kept, notes
