"""Key-path differences between two JSON-like configs."""

from __future__ import annotations

from typing import Any

from nemo_convert.verify.report import ConfigDiff


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
