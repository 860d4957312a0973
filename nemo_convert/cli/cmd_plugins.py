"""``nemo-convert plugins``: what is installed, and which distribution provides it."""

from __future__ import annotations

import argparse
from typing import Any

from nemo_convert.cli.common import TABLE_MIN_WIDTH, QUIET_RESULT_HELP, common_flags, output_width, print_json, wrapped


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("plugins", help="list model families, tokenizer patchers, sharding strategies, verifiers and "
                                            "output targets",
                       description="List the model families, tokenizer patchers, sharding strategies, "
                                   "verifiers (the extra checks of verify, with their options) and output targets "
                                   "(what --to writes) provided by installed plugins, with the distribution of "
                                   "each.")
    common_flags(p, quiet_help=QUIET_RESULT_HELP)
    p.set_defaults(func=run)


def collect() -> dict[str, list[dict[str, Any]]]:
    from nemo_convert.plugins.manager import get_registry  # lazy: CLI start-up time (loads the plugins)

    reg = get_registry()
    fams = [{"name": n, "plugin": p.plugin, "distribution": p.distribution,
             "hf_architectures": list(p.record.hf_architectures), "description": p.record.description}
            for n, p in sorted(reg.families.items())]
    toks = [{"name": n, "plugin": p.plugin, "distribution": p.distribution, "description": p.record.description}
            for n, p in sorted(reg.tokenizer_patchers.items())]
    shard = [{"name": n, "axis": p.record.axis, "plugin": p.plugin, "distribution": p.distribution,
              "description": p.record.description} for n, p in sorted(reg.sharding_strategies.items())]
    checks = [{"name": n, "plugin": p.plugin, "distribution": p.distribution,
               "options": [{"command": o.command, "flag": o.flag, "kind": o.kind, "metavar": o.metavar,
                            "help": o.help} for o in p.record.options],
               "description": p.record.description} for n, p in sorted(reg.verifiers.items())]
    outs = [{"name": t.name, "kind": t.kind, "takes": sorted(t.options), "plugin": p.plugin,
             "distribution": p.distribution, "description": t.description}
            for p in reg.output_targets.values() for t in [p.record]]
    return {"model_families": fams, "tokenizer_patchers": toks, "sharding_strategies": shard, "verifiers": checks,
            "output_targets": outs}


def _usage(option: dict[str, Any]) -> str:
    """``--texts TEXT …``: how an option is spelled on the command line."""
    meta = option["metavar"] or option["flag"].lstrip("-").upper()
    return {"switch": option["flag"], "value": f"{option['flag']} {meta}"}.get(
        option["kind"], f"{option['flag']} {meta} …")


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_usage(v) if isinstance(v, dict) else str(v) for v in value)
    return str(value)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    data = collect()
    if args.json:
        print_json(data)
        return 0
    if args.quiet:  # exit 0: the plugins load (2, with an error line, on a conflict)
        return 0
    width = output_width()
    if width < TABLE_MIN_WIDTH:  # narrow or piped: one indented block per record
        out = Console(soft_wrap=True, highlight=False)
        for title, rows in data.items():
            out.print(f"[bold]{title.replace('_', ' ')}[/]")
            for r in rows:
                what = (", ".join(r.get("hf_architectures", [])) or (f"axis {r['axis']}" if "axis" in r else "")
                        or (f"kind {r['kind']}" if "kind" in r else "") or _cell(r.get("options", [])))
                out.print(f"  [bold]{r['name']}[/]" + (f" ({what})" if what else ""))
                for line in wrapped(f"{r['description']} [plugin {r['plugin']}, {r['distribution']}]",
                                    width, "      "):
                    out.print(line, markup=False)
        return 0
    console = Console(soft_wrap=True)
    for title, rows in data.items():
        table = Table(title=title.replace("_", " "), title_justify="left")
        cols = [c for c in (rows[0].keys() if rows else ["name", "distribution"])]
        for c in cols:
            table.add_column(c)
        for r in rows:
            table.add_row(*[_cell(v) for v in r.values()])
        console.print(table)
    return 0
