"""``nemo-convert tokenizer add-tokens``: append tokens to a tokenizer or a ``.nemo``'s tokenizer."""

from __future__ import annotations

import argparse

from nemo_convert.cli.common import common_flags, print_json


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    g = sub.add_parser("tokenizer", help="edit tokenizers (add tokens)",
                       description="Edit tokenizers: SentencePiece .model files, Hugging Face tokenizer folders "
                                   "and the tokenizer embedded in a .nemo.")
    gsub = g.add_subparsers(dest="tokenizer_command", metavar="SUBCOMMAND", required=True)
    p = gsub.add_parser(
        "add-tokens", help="append tokens to a tokenizer (.model, HF folder or .nemo)",
        description="Write a copy of IN with the given tokens appended after every existing id (existing ids and "
                    "the encoding of text without the new tokens do not change). IN is a SentencePiece .model "
                    "file, a Hugging Face tokenizer folder (tokenizer.json), or a .nemo (tar, gzip or unpacked "
                    "folder); for a .nemo the embedded tokenizer is patched and a new .nemo is written with "
                    "every other member copied unchanged. Embeddings are never resized. IN is never modified.")
    p.add_argument("src", metavar="IN", help=".model file, HF tokenizer folder, or .nemo")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="where to write the patched copy (a .model file, a folder, or a .nemo tar)")
    p.add_argument("--tokens", nargs="+", required=True, metavar="T", help="the tokens to add, in order")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--user-defined", dest="piece_type", action="store_const", const="user_defined",
                      help="SentencePiece USER_DEFINED pieces, matched in raw text (default); for an HF "
                           "tokenizer: plain added tokens")
    kind.add_argument("--control", dest="piece_type", action="store_const", const="control",
                      help="SentencePiece CONTROL pieces, never produced from raw text (NeMo's script default); "
                           "for an HF tokenizer: special tokens")
    p.set_defaults(piece_type="user_defined")
    p.add_argument("--skip-existing", action="store_true",
                   help="leave out tokens the tokenizer already has instead of failing")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUT if it is an output of the kind written (or an empty folder); anything else is "
                        "refused")
    common_flags(p)
    p.set_defaults(func=run_add_tokens)


def run_add_tokens(args: argparse.Namespace) -> int:
    from rich.console import Console

    from nemo_convert.convert.tokenizer_patch import add_tokens  # lazy: CLI start-up time

    rep = add_tokens(args.src, args.output, args.tokens, piece_type=args.piece_type,
                     skip_existing=args.skip_existing, overwrite=args.overwrite)
    if args.json:
        print_json(rep.as_dict())
        return 0
    if args.quiet:
        return 0
    console = Console(stderr=True, soft_wrap=True)
    added = ", ".join(f"{t} → {i}" for t, i in rep.added) or "none"
    console.print(f"wrote {rep.output}: added {len(rep.added)} token(s) ({added}); vocabulary "
                  f"{rep.old_vocab_size} → {rep.new_vocab_size}", highlight=False)
    if rep.skipped:
        console.print(f"  skipped (already present): {', '.join(rep.skipped)}", highlight=False)
    for t in rep.tokenizers if len(rep.tokenizers) > 1 else ():
        console.print(f"  {t.file} ({t.patcher}): {t.old_vocab_size} → {t.new_vocab_size}", highlight=False)
    for old, new in rep.artifacts.items():
        console.print(f"  artifact {old} → {new}", highlight=False)
    for n in rep.notes:
        console.print(f"  note: {n}", highlight=False)
    return 0
