"""The result of ``verify``: per-tensor, config and tokenizer comparisons, and the
results of the plugins' verifiers (``extra``), shown without naming any of them."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from nemo_convert.plugins.records import ReportItem

#: Tensor statuses that count as a match.
MATCHING = ("equal", "close", "skipped")


def _clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats become the strings ``"inf"``, ``"-inf"``, ``"nan"``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


@dataclass
class SideInfo:
    """One of the two checkpoints."""

    path: str
    format: str  # "hf", "nemo", "megatron-bridge" or "megatron-lm"
    layout: str | None = None
    family: str | None = None


@dataclass
class TensorDiff:
    """One tensor, by its HF name.

    ``status``: ``equal`` (bit-identical), ``close`` (within tolerance, not identical),
    ``different`` (beyond tolerance), ``shape`` / ``dtype`` (mismatch; a floating dtype
    change is ``close`` / ``different`` instead with ``allow_dtype_change``), ``missing_a`` /
    ``missing_b`` (on one side only), ``skipped`` (on one side only, and not a weight:
    the family drops it). ``max_abs`` = max |a − b|, ``max_rel`` = max |a − b| / |b|
    (``inf`` where b = 0 and a ≠ b); ``mismatched`` counts elements with
    |a − b| > atol + rtol·|b|; ``worst_index`` is where |a − b| is largest.
    """

    name: str
    status: str
    shape_a: list[int] | None = None
    shape_b: list[int] | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    mismatched: int | None = None
    numel: int | None = None
    worst_index: list[int] | None = None
    value_a: float | None = None
    value_b: float | None = None
    note: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in MATCHING


@dataclass
class ConfigDiff:
    """One differing key path of the two HF configs (``kind``: changed, missing_a, missing_b)."""

    path: str
    kind: str
    a: Any = None
    b: Any = None


@dataclass
class TokenizerFileDiff:
    name: str
    status: str  # identical, equivalent (same JSON), different, missing_a, missing_b
    diffs: list[ConfigDiff] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status in ("identical", "equivalent")


@dataclass
class EncodingDiff:
    """One tokenizer kind (``sentencepiece`` from ``tokenizer.model``, ``hf`` from
    ``tokenizer.json``) loaded on both sides and run over the probe texts."""

    kind: str
    vocab_size_a: int
    vocab_size_b: int
    probes: int
    differing: int
    examples: list[dict[str, Any]] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)  # special/added tokens only A has
    only_b: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.vocab_size_a == self.vocab_size_b and self.differing == 0 and not self.only_a and not self.only_b


@dataclass
class TokenizerReport:
    files: list[TokenizerFileDiff] = field(default_factory=list)
    encodings: list[EncodingDiff] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files) and all(e.ok for e in self.encodings)


def result_json(result: Any) -> Any:
    """What ``--json`` prints for a verifier's result (``VerifierResult``): its
    ``as_dict()``, a plain ``dict`` as it is, another object's fields."""
    as_dict = getattr(result, "as_dict", None)
    if callable(as_dict):
        return as_dict()
    if not isinstance(result, dict) and hasattr(result, "__dict__"):
        return dict(vars(result))
    return result


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def result_items(name: str, result: Any) -> list[ReportItem]:
    """The text report of verifier ``name``'s result: its ``render()`` items, or else one
    ``name.key: value`` line per field of a ``dict`` (or of an object), or ``name: value``."""
    render = getattr(result, "render", None)
    if callable(render):
        return list(render())
    fields = result if isinstance(result, dict) else vars(result) if hasattr(result, "__dict__") else None
    if fields is None:
        return [f"{name}: {_short(result)}"]
    return [f"{name}.{k}: {_short(v)}" for k, v in fields.items()] or [f"{name}: (empty)"]


#: The verifier whose result ``VerifyReport.clip`` and the JSON's top-level ``"clip"``
#: repeat. Deprecated: docs/api.md and docs/cli.md promised both before verifiers were
#: generic; read ``extra["clip"]`` instead. To be removed with them.
DEPRECATED_TOP_LEVEL = "clip"


@dataclass
class VerifyReport:
    """Everything ``verify`` compared. ``ok`` is true when every tensor matches within
    the tolerance, the HF configs are equal and the tokenizers behave identically. The
    results of plugin-provided verifiers (``extra``, by verifier name; the CLIP plugin's
    zero-shot probabilities are ``extra["clip"]``) are informational. With ``allow_dtype_change``, tensors of
    different floating dtypes are compared by value and a changed config ``dtype`` /
    ``torch_dtype`` is a note, not a difference."""

    a: SideInfo
    b: SideInfo
    atol: float
    rtol: float
    allow_dtype_change: bool = False
    tensors: list[TensorDiff] = field(default_factory=list)
    config: list[ConfigDiff] = field(default_factory=list)
    tokenizer: TokenizerReport = field(default_factory=TokenizerReport)
    extra: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def clip(self) -> Any:
        """Deprecated: ``extra.get("clip")``, the CLIP plugin's result (docs/api.md promised
        this attribute before verifiers were generic)."""
        warnings.warn("VerifyReport.clip is deprecated; use VerifyReport.extra.get('clip')", DeprecationWarning,
                      stacklevel=2)
        return self.extra.get(DEPRECATED_TOP_LEVEL)

    @property
    def tensors_ok(self) -> bool:
        return all(t.ok for t in self.tensors)

    @property
    def config_ok(self) -> bool:
        return not self.config

    @property
    def tokenizer_ok(self) -> bool:
        return self.tokenizer.ok

    @property
    def ok(self) -> bool:
        return self.tensors_ok and self.config_ok and self.tokenizer_ok

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.status] = out.get(t.status, 0) + 1
        return out

    def worst(self, n: int = 10) -> list[TensorDiff]:
        """The ``n`` worst tensors: non-matching first, then by largest absolute difference."""
        def key(t: TensorDiff) -> tuple[int, float]:
            return (0 if not t.ok else 1, -(t.max_abs if t.max_abs is not None else math.inf if not t.ok else 0.0))
        return sorted(self.tensors, key=key)[:n]

    def as_dict(self) -> dict[str, Any]:
        def plain(obj: Any) -> Any:
            return dict(obj.__dict__) if obj is not None else None

        tok = self.tokenizer
        return _clean({
            "ok": self.ok,
            "tensors_ok": self.tensors_ok,
            "config_ok": self.config_ok,
            "tokenizer_ok": self.tokenizer_ok,
            "a": plain(self.a),
            "b": plain(self.b),
            "atol": self.atol,
            "rtol": self.rtol,
            "allow_dtype_change": self.allow_dtype_change,
            "counts": self.counts(),
            "tensors": [plain(t) for t in self.tensors],
            "config": [plain(c) for c in self.config],
            "tokenizer": {
                "ok": tok.ok,
                "files": [{**plain(f), "diffs": [plain(d) for d in f.diffs]} for f in tok.files],
                "encodings": [plain(e) for e in tok.encodings],
                "notes": list(tok.notes),
            },
            # deprecated: the same as extra.clip (DEPRECATED_TOP_LEVEL)
            DEPRECATED_TOP_LEVEL: result_json(self.extra.get(DEPRECATED_TOP_LEVEL)),
            "extra": {name: result_json(r) for name, r in self.extra.items()},
            "notes": list(self.notes),
        })
