"""Append tokens to a SentencePiece model (``tokenizer.model``), bytes in and bytes out.

NeVA and other NeMo recipes need tokens such as ``<extra_id_0>`` … ``<extra_id_7>`` and
``<image>`` in a SentencePiece tokenizer. NeMo's own script for this needs a
``protoc``-generated protobuf module; here the ``ModelProto`` is parsed with the
``sentencepiece_model_pb2`` module that ships inside the ``sentencepiece`` package.

Each new token becomes a new piece at the end of ``ModelProto.pieces`` with score 0 and
type ``USER_DEFINED`` (matched inside raw text by ``encode``) or ``CONTROL`` (never produced
from raw text; reachable only through its id or ``piece_to_id``). New ids are therefore
``old_vocab_size + i``, and every existing piece keeps its id, score and type. Nothing else
in the proto changes: the trainer and normalizer specs are left exactly as they were (so
``trainer_spec.vocab_size`` still records the size the model was trained with).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from nemo_convert.errors import InputError, NemoConvertError

__all__ = [
    "PatchReport",
    "TokenizerPatchError",
    "add_tokens_sentencepiece",
    "encode_probe",
    "sentencepiece_vocab_size",
]

PieceType = Literal["user_defined", "control"]


class TokenizerPatchError(NemoConvertError):
    """A patched tokenizer failed its own check after the edit (it should not happen)."""


@dataclass(frozen=True)
class PatchReport:
    """What a tokenizer patch did.

    Attributes:
        old_vocab_size: Size of the id space before the patch.
        new_vocab_size: Size of the id space after the patch
            (``old_vocab_size + len(added)``).
        added: ``(token, id)`` for every token added, in the order given.
        skipped: Tokens left out because they were already present (``skip_existing``).
        notes: Human-readable remarks for the user (e.g. files copied unchanged that do
            not know about the new tokens). Empty when there is nothing to say.
    """

    old_vocab_size: int
    new_vocab_size: int
    added: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_new_tokens(tokens: Sequence[str]) -> list[str]:
    """Validate a list of tokens to add: strings, non-empty, no duplicates.

    Shared by the SentencePiece and HF patchers. Returns the tokens as a list.

    Raises:
        InputError: a token is not a string or is empty, or a token is given twice.
    """
    if isinstance(tokens, (str, bytes)):
        raise InputError("tokens must be a sequence of strings, not a single string")
    out: list[str] = []
    seen: set[str] = set()
    dups: list[str] = []
    for tok in tokens:
        if not isinstance(tok, str):
            raise InputError(f"token {tok!r} is not a string")
        if tok == "":
            raise InputError("cannot add an empty token")
        if tok in seen and tok not in dups:
            dups.append(tok)
        seen.add(tok)
        out.append(tok)
    if dups:
        raise InputError(
            "token(s) given more than once: " + ", ".join(repr(t) for t in dups)
        )
    return out


def _pb2() -> Any:
    """The ``sentencepiece_model_pb2`` module shipped with the sentencepiece package."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as exc:  # pragma: no cover - dependency is declared
        raise NemoConvertError(
            "the 'sentencepiece' package (>= 0.2, with protobuf) is needed to edit "
            f"SentencePiece models: {exc}"
        ) from exc
    return sentencepiece_model_pb2


def _processor(model: bytes) -> Any:
    """A ``SentencePieceProcessor`` loaded from serialized model bytes."""
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_proto=model)


def _parse(model: bytes) -> Any:
    """Parse and sanity-check a serialized ``ModelProto``.

    Raises:
        InputError: the bytes are not a loadable SentencePiece model.
    """
    if not isinstance(model, (bytes, bytearray, memoryview)):
        raise InputError(f"expected the SentencePiece model as bytes, got {type(model).__name__}")
    data = bytes(model)
    pb2 = _pb2()
    proto = pb2.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # google.protobuf.message.DecodeError and friends
        raise InputError(f"not a SentencePiece model (protobuf parse failed: {exc})") from exc
    if len(proto.pieces) == 0:
        raise InputError("not a SentencePiece model (it has no pieces)")
    try:
        _processor(data)
    except Exception as exc:  # sentencepiece raises RuntimeError / OSError
        raise InputError(f"SentencePiece could not load the model: {exc}") from exc
    return proto


def sentencepiece_vocab_size(model: bytes) -> int:
    """Number of pieces (= size of the id space) of a serialized SentencePiece model.

    Raises:
        InputError: the bytes are not a loadable SentencePiece model.
    """
    return len(_parse(model).pieces)


def encode_probe(model: bytes, texts: Iterable[str]) -> list[list[int]]:
    """Encode each text with the model (no BOS/EOS added) and return the id lists.

    Used to check that a patch leaves the encoding of existing text unchanged.

    Raises:
        InputError: the bytes are not a loadable SentencePiece model.
    """
    try:
        sp = _processor(bytes(model))
    except Exception as exc:
        raise InputError(f"SentencePiece could not load the model: {exc}") from exc
    return [list(sp.encode(text, out_type=int)) for text in texts]


def _has_whitespace(token: str) -> bool:
    return any(ch.isspace() or unicodedata.category(ch) == "Zs" for ch in token)


def add_tokens_sentencepiece(
    model: bytes,
    tokens: Sequence[str],
    *,
    piece_type: PieceType = "user_defined",
    skip_existing: bool = False,
) -> tuple[bytes, PatchReport]:
    """Append ``tokens`` as new pieces of a serialized SentencePiece model.

    Args:
        model: The serialized ``ModelProto`` (contents of a ``tokenizer.model``).
        tokens: Tokens to add, in order; token ``i`` (after skipped ones are removed)
            gets id ``old_vocab_size + i``.
        piece_type: ``"user_defined"`` (SentencePiece ``USER_DEFINED`` = 4; matched as one
            piece wherever it appears in raw text) or ``"control"`` (``CONTROL`` = 3;
            never produced by ``encode`` from raw text, only reachable by id). NeVA's
            ``<extra_id_N>`` / ``<image>`` tokens must be ``user_defined``.
        skip_existing: Skip (and report) tokens already present as any piece, instead
            of failing.

    Returns:
        The serialized patched model and a :class:`PatchReport`.

    Raises:
        InputError: the model cannot be parsed or loaded; a token is empty, given twice,
            already present (without ``skip_existing``), or contains whitespace while
            ``piece_type`` is ``"user_defined"`` (SentencePiece could never match it).
        TokenizerPatchError: the patched model failed to reload with the expected ids.
    """
    if piece_type not in ("user_defined", "control"):
        raise InputError(f"piece_type must be 'user_defined' or 'control', not {piece_type!r}")
    wanted = check_new_tokens(tokens)
    proto = _parse(model)
    pb2 = _pb2()
    type_enum = pb2.ModelProto.SentencePiece.Type
    new_type = type_enum.Value("USER_DEFINED" if piece_type == "user_defined" else "CONTROL")

    if piece_type == "user_defined":
        spaced = [t for t in wanted if _has_whitespace(t)]
        if spaced:
            raise InputError(
                "SentencePiece never matches a user-defined piece containing whitespace "
                "(the normalizer turns spaces into '▁' first): "
                + ", ".join(repr(t) for t in spaced)
            )

    existing = {p.piece: i for i, p in enumerate(proto.pieces)}
    old_size = len(proto.pieces)
    present = [t for t in wanted if t in existing]
    if present and not skip_existing:
        raise InputError(
            "token(s) already in the SentencePiece model: "
            + ", ".join(f"{t!r} (id {existing[t]})" for t in present)
            + "; pass --skip-existing (skip_existing=True in Python) to leave them out"
        )

    added: list[tuple[str, int]] = []
    for tok in wanted:
        if tok in existing:
            continue
        piece = proto.pieces.add()
        piece.piece = tok
        piece.score = 0.0
        piece.type = new_type
        added.append((tok, old_size + len(added)))

    if not added:
        out = bytes(model)
    else:
        out = proto.SerializeToString()
        _verify(out, old_size, added, piece_type)
    report = PatchReport(
        old_vocab_size=old_size,
        new_vocab_size=old_size + len(added),
        added=added,
        skipped=present,
    )
    return out, report


def _verify(out: bytes, old_size: int, added: list[tuple[str, int]], piece_type: PieceType) -> None:
    """Reload the patched model and check size, ids and types of the new pieces."""
    try:
        sp = _processor(out)
    except Exception as exc:
        raise TokenizerPatchError(f"the patched SentencePiece model does not load: {exc}") from exc
    if sp.get_piece_size() != old_size + len(added):
        raise TokenizerPatchError(
            f"patched model has {sp.get_piece_size()} pieces, expected {old_size + len(added)}"
        )
    for tok, idx in added:
        got = sp.piece_to_id(tok)
        if got != idx:
            raise TokenizerPatchError(f"patched model maps {tok!r} to id {got}, expected {idx}")
        if piece_type == "control" and not sp.is_control(idx):
            raise TokenizerPatchError(f"patched piece {tok!r} (id {idx}) is not a control piece")


def sentencepiece_special_ids(model: bytes) -> dict[str, int]:
    """``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` of a serialized SentencePiece
    model, as HF names them; an id the model does not define (-1) is left out.

    Raises:
        InputError: the bytes are not a loadable SentencePiece model.
    """
    _parse(model)
    sp = _processor(bytes(model))
    ids = {"bos_token_id": sp.bos_id(), "eos_token_id": sp.eos_id(), "pad_token_id": sp.pad_id()}
    return {k: int(v) for k, v in ids.items() if v >= 0}
