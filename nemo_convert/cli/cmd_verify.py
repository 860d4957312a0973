"""``nemo-convert verify``: compare two checkpoints (tensors, config, tokenizer).

Exit codes: 0 everything equal within the tolerance; 1 a difference beyond it (a result,
not an error); 2 bad input.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from nemo_convert.cli.common import (TABLE_MIN_WIDTH, QUIET_RESULT_HELP, common_flags, hf_source, output_width,
                                     print_json, revision_flag, wrapped)
from nemo_convert.cli.plugin_options import plugin_option_values
from nemo_convert.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "verify", help="compare two checkpoints (tensors, config, tokenizer); exit 1 on a difference",
        description="Compare checkpoints A and B in any formats nemo-convert reads (HF folder, .nemo in any "
                    "layout) through the model family's mapping: both are brought to HF tensor names (a .nemo "
                    "is streamed tensor by tensor), then every tensor is compared (bit-exact by default), the "
                    "HF configs are diffed key by key and the tokenizers are compared by vocab size and the "
                    "encodings of a probe text set. Exit 0 when everything matches within the tolerance, 1 on "
                    "a difference, 2 on bad input.")
    p.add_argument("a", metavar="A", help="HF folder (or cached hub id), .nemo file or unpacked .nemo folder")
    p.add_argument("b", metavar="B", help="HF folder (or cached hub id), .nemo file or unpacked .nemo folder")
    revision_flag(p)
    p.add_argument("--atol", type=float, default=0.0,
                   help="absolute tolerance: |a-b| <= atol + rtol*|b| passes (default 0: exact)")
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (default 0: exact)")
    p.add_argument("--allow-dtype-change", action="store_true",
                   help="compare tensors of different floating dtypes by value (both upcast; --atol/--rtol "
                        "apply) and accept a changed config dtype, instead of counting a dtype change as a "
                        "difference; the changes are still listed")
    p.add_argument("--no-rope-scaling", dest="rope_scaling", action="store_false",
                   help="read a NeMo-written .nemo's scale_positional_embedding: True as no RoPE scaling "
                        "(as export --no-rope-scaling does) instead of llama3 scaling as NeMo runs it")
    p.add_argument("--drop-head", action="store_true",
                   help="compare a NeMo-Aligner reward model's language model, its reward head (rm_head) left "
                        "out, as export --drop-head writes it (default: such a .nemo is refused)")
    p.add_argument("--family", help="model family of .nemo inputs (default: from their config)")
    p.add_argument("--top", type=int, default=10, metavar="N", help="how many worst tensors to list (default 10)")
    p.add_argument("--trust-pickle", action="store_true",
                   help="allow arbitrary code in pickled weights (DANGEROUS; only for files you trust)")
    common_flags(p, quiet_help=QUIET_RESULT_HELP)
    p.set_defaults(func=run)


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return "0" if x == 0 else f"{x:.3g}"


def _val(x: float | None) -> str:
    return "-" if x is None else f"{x:.9g}"


def _side(s: object) -> str:
    layout = f", {s.layout} layout" if getattr(s, "layout", None) else ""  # type: ignore[attr-defined]
    fam = f", family {s.family}" if getattr(s, "family", None) else ""  # type: ignore[attr-defined]
    return f"{s.path} ({s.format}{layout}{fam})"  # type: ignore[attr-defined]


def _short(v: object, limit: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def print_extra(con: Any, extra: dict[str, Any]) -> None:
    """Print the plugins' verifiers' results on ``con`` (a rich ``Console``), knowing none
    by name: each result's items (``VerifierResult``), tables drawn like ours, lines
    indented; every text plain (no markup)."""
    from rich.table import Table
    from rich.text import Text

    from nemo_convert.plugins.records import ResultTable  # lazy: CLI start-up time
    from nemo_convert.verify.report import result_items  # lazy: CLI start-up time

    for name, result in extra.items():
        for item in result_items(name, result):
            if isinstance(item, ResultTable):
                table = Table(title=Text(item.title, style="table.title"), title_justify="left")
                for c in item.columns:
                    table.add_column(Text(c))
                for row in item.rows:
                    table.add_row(*[Text(c) for c in row])
                con.print(table)
            else:
                con.print(f"  {item}", markup=False)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from nemo_convert.verify import verify  # lazy: CLI start-up time

    if args.top < 0:
        raise InputError("--top must be >= 0")
    rep = verify(hf_source(args, args.a, one_of_several=True), hf_source(args, args.b, one_of_several=True), atol=args.atol, rtol=args.rtol, family=args.family,
                 trust_pickle=args.trust_pickle, allow_dtype_change=args.allow_dtype_change,
                 rope_scaling=args.rope_scaling, drop_head=args.drop_head,
                 options=plugin_option_values(args))  # the plugins' verifiers' options
    code = 0 if rep.ok else 1
    if args.json:
        print_json(rep.as_dict())
        return code
    if args.quiet:
        return code
    # Laid out for the terminal's width, or 80 columns when piped; tensor names stay whole.
    width = output_width()
    con = Console(highlight=False, width=width)
    con.print(f"A: {_side(rep.a)}")
    con.print(f"B: {_side(rep.b)}")
    tol = "exact" if rep.atol == 0 and rep.rtol == 0 else f"atol {rep.atol:g}, rtol {rep.rtol:g}"
    if rep.allow_dtype_change:
        tol += ", dtype changes allowed"
    counts = rep.counts()
    con.print(f"[bold]tensors[/]: {len(rep.tensors)} compared ({tol}): "
              + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    worst = [t for t in rep.worst(args.top) if not t.ok or t.status == "close"] if args.top else []
    if worst and width < TABLE_MIN_WIDTH:  # one indented block per tensor instead of a 170-column table
        con.print("worst tensors")
        for t in worst:
            con.print(f"  {t.name}", markup=False, overflow="ignore", crop=False)
            shapes = "×".join(map(str, t.shape_a or [])) if t.shape_a == t.shape_b else (
                f"{'×'.join(map(str, t.shape_a)) if t.shape_a is not None else '-'} / "
                f"{'×'.join(map(str, t.shape_b)) if t.shape_b is not None else '-'}")
            dtypes = t.dtype_a if t.dtype_a == t.dtype_b else f"{t.dtype_a or '-'} / {t.dtype_b or '-'}"
            facts = [t.status, f"shape {shapes}", f"dtype {dtypes}", f"max abs {_num(t.max_abs)}",
                     f"max rel {_num(t.max_rel)}"]
            if t.mismatched is not None:
                facts.append(f"{t.mismatched}/{t.numel} mismatched")
            if t.worst_index is not None:
                facts.append(f"worst at {t.worst_index}: {_val(t.value_a)} vs {_val(t.value_b)}")
            elif t.note:
                facts.append(t.note)
            for line in wrapped(", ".join(facts), width, "      "):
                con.print(line, markup=False, overflow="ignore", crop=False)
    elif worst:
        table = Table("tensor", "status", "shape A / B", "dtype A / B", "max abs", "max rel", "mismatched",
                      "worst at (A vs B)", title="worst tensors", title_justify="left")
        for t in worst:
            shapes = "×".join(map(str, t.shape_a or [])) if t.shape_a == t.shape_b else (
                f"{'×'.join(map(str, t.shape_a)) if t.shape_a is not None else '-'} / "
                f"{'×'.join(map(str, t.shape_b)) if t.shape_b is not None else '-'}")
            dtypes = t.dtype_a if t.dtype_a == t.dtype_b else f"{t.dtype_a or '-'} / {t.dtype_b or '-'}"
            where = (f"{t.worst_index}: {_val(t.value_a)} vs {_val(t.value_b)}" if t.worst_index is not None
                     else (t.note or ""))
            table.add_row(t.name, t.status, shapes, str(dtypes), _num(t.max_abs), _num(t.max_rel),
                          "-" if t.mismatched is None else f"{t.mismatched}/{t.numel}", where)
        con.print(table)
    if rep.config:
        con.print(f"[bold]config[/]: {len(rep.config)} difference(s)")
        for c in rep.config:
            con.print(f"  {c.path}: {_short(c.a) if c.kind != 'missing_a' else '(missing)'} → "
                      f"{_short(c.b) if c.kind != 'missing_b' else '(missing)'}")
    else:
        con.print("[bold]config[/]: equal")
    tok = rep.tokenizer
    con.print(f"[bold]tokenizer[/]: {'equal' if tok.ok else 'different'}")
    for f in tok.files:
        if not f.ok:
            extra = "; ".join(f"{d.path}: {_short(d.a, 30)} → {_short(d.b, 30)}" for d in f.diffs[:3])
            con.print(f"  {f.name}: {f.status}{' (' + extra + ')' if extra else ''}")
    for e in tok.encodings:
        line = (f"  {e.kind}: vocab {e.vocab_size_a} vs {e.vocab_size_b}, "
                f"{e.differing}/{e.probes} probe texts encode differently")
        if e.only_a or e.only_b:
            line += f"; tokens only in A: {e.only_a or '-'}, only in B: {e.only_b or '-'}"
        con.print(line)
        for ex in e.examples[:2]:
            con.print(f"    {ex['text']!r}: A {ex['a']} vs B {ex['b']}")
    for n in tok.notes + rep.notes:
        con.print(f"  note: {n}")
    print_extra(con, rep.extra)
    con.print("[bold green]OK[/]: the checkpoints match" if rep.ok
              else "[bold red]MISMATCH[/]: the checkpoints differ")
    return code
