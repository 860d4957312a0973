"""Config translation as a table: HF ``config.json`` ⇄ NeMo ``model_config.yaml``.

A family declares its translation once, as rows; both directions are derived from them:

* :class:`Field` — one HF key ⇄ one NeMo field (a dotted path, e.g.
  ``nemo_convert.vocab_size``), with the HF default and a value converter each way;
* :class:`Derived` — several HF keys ⇄ several NeMo fields through a pair of functions,
  for what one key cannot say (RoPE, spelled three ways; the dtype);
* :class:`Check` — HF keys that change nothing *as long as* a condition holds (Qwen2's
  ``sliding_window`` while ``use_sliding_window`` is false); otherwise the import is
  refused with the reason;
* :class:`NemoCheck` — the same on the NeMo side: a NeMo config whose math the family's HF
  class does not compute is refused on export, by name (:meth:`ConfigTable.refuse_nemo`).

**Strict, like the tensors.** Every key of ``config.json`` is translated by a row, or is one
of the keys known not to change the model's math (:data:`HARMLESS_KEYS` plus the family's
own), or the import fails with one line naming the key and its value. The user's explicit
escape is ``--ignore-config-key KEY``: the core then translates the config as if the key
were absent, and records that it did.

On export the source ``config.json`` (kept verbatim by the core in
``nemo_convert.hf_config``) is restored key for key, in its own spelling; the table
overwrites only the keys that it derives from NeMo fields and that the source has. A
``.nemo`` that NeMo wrote itself has no source config: the table then writes every row,
in a spelling transformers v4 and v5 both read.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Union

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.mapping.rules import cfg_get
from nemo_convert.spec import provenance_of

#: Keys that say nothing about the model's math: kept verbatim, never translated.
HARMLESS_KEYS: tuple[str, ...] = (
    "architectures", "model_type", "transformers_version", "_name_or_path", "name_or_path", "auto_map",
    "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "output_attentions", "output_hidden_states", "return_dict", "torchscript", "is_encoder_decoder",
    "id2label", "label2id", "problem_type", "tokenizer_class", "task_specific_params", "finetuning_task",
    "prefix", "chunk_size_feed_forward", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
    "tie_encoder_decoder", "pruned_heads", "_attn_implementation", "_attn_implementation_autoset",
    "attn_implementation", "quantization_config_applied", "keys_to_ignore_at_inference", "pretraining_tp",
    # Generation settings that older configs carry beside the model fields.
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens",
    # Older PretrainedConfig attributes (training or framework switches).
    "use_bfloat16", "tf_legacy_loss", "_commit_hash", "gradient_checkpointing", "output_past",
    # The version stamp Unsloth's save writes beside transformers_version (published configs carry it).
    "unsloth_version",
)

Convert = Callable[[Any], Any]


def refuse_unknown_keys(cfg: Mapping[str, Any], known: Iterable[str], family: str, section: str = "") -> None:
    """Strictness for one section of ``config.json`` (``section`` is its dotted prefix, e.g.
    ``"vision_config."``): a key neither in ``known`` nor in :data:`HARMLESS_KEYS` fails the
    import, by name, in one line."""
    allowed = set(known) | set(HARMLESS_KEYS)
    for key in cfg:
        if key not in allowed:
            name = section + key
            raise ConfigError(f"{name}={cfg[key]!r} is not understood by family {family} (convert it with the "
                              f"family that has it, or pass --ignore-config-key {name} to drop it knowingly)")


def _same(x: Any) -> Any:
    return x


def positive_int(key: str) -> Convert:
    """``int``, refusing a value below 1 by the config key's name (``num_hidden_layers: -1``
    would otherwise surface later as tensors the mapping cannot place)."""
    def convert(value: Any) -> int:
        n = int(value)
        if n < 1:
            raise ConfigError(f"config.json {key}={value!r}: must be a positive integer")
        return n

    return convert


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: ``Field.default`` for keys the config must have.
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Field:
    """One HF key ⇄ one NeMo field.

    :param hf: the ``config.json`` key.
    :param nemo: the NeMo field, a dotted path (``nemo_convert.vocab_size``).
    :param default: the value when the key is absent or null (transformers' default);
        :data:`REQUIRED` refuses a config without it. A callable is given the HF config.
    :param to_nemo: HF value → NeMo value.
    :param to_hf: NeMo value → HF value; ``None``: the key is never written back.
    :param accept: HF values the family represents exactly; any other is refused by name.
    :param nemo_default: NeMo config → HF value, for a NeMo config without the field
        (returning None leaves the key out); without it a required field must be there.
    :param always: on export, write the key even when the source config lacked it.
    """

    hf: str
    nemo: str
    default: Any = REQUIRED
    to_nemo: Convert = _same
    to_hf: Convert | None = _same
    accept: Callable[[Any], bool] | None = None
    nemo_default: Callable[[dict[str, Any]], Any] | None = None
    always: bool = False

    @property
    def hf_keys(self) -> tuple[str, ...]:
        return (self.hf,)


@dataclass(frozen=True)
class Derived:
    """Several HF keys ⇄ NeMo fields through a pair of functions (each sees the whole
    config of its side and returns a dict; NeMo keys may be dotted paths).

    :param restore: on export of a config with a recorded source, overwrite the source's
        keys with ``to_hf``'s values; by default the source's spelling is kept as it is.
    """

    hf_keys: tuple[str, ...]
    to_nemo: Callable[[dict[str, Any]], dict[str, Any]]
    to_hf: Callable[[dict[str, Any]], dict[str, Any]]
    restore: bool = False


@dataclass(frozen=True)
class Check:
    """HF keys that leave the model's math unchanged as long as ``refuse(hf_config)``
    returns None; otherwise the import fails with the returned reason."""

    hf_keys: tuple[str, ...]
    refuse: Callable[[dict[str, Any]], str | None]


@dataclass(frozen=True)
class NemoCheck:
    """NeMo fields the family's HF class computes only in some settings: ``refuse(nemo_config)``
    returns None when it computes this config, else the reason (one line, naming the
    field and its value). Run on export before anything is written, and when a family is
    chosen for a NeMo-native config. ``name`` identifies the check: a table's ``extend``
    with a check of the same name replaces it."""

    name: str
    refuse: Callable[[dict[str, Any]], str | None]

    @property
    def hf_keys(self) -> tuple[str, ...]:
        return ()


Row = Union[Field, Derived, Check, NemoCheck]


def set_path(cfg: dict[str, Any], path: str, value: Any) -> None:
    """``cfg["a"]["b"] = value`` for ``"a.b"``, creating sections."""
    *parents, last = path.split(".")
    cur = cfg
    for p in parents:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            nxt = cur[p] = {}
        cur = nxt
    cur[last] = value


def _present(hf: dict[str, Any], key: str) -> bool:
    return hf.get(key) is not None


@dataclass(frozen=True)
class ConfigTable:
    """A family's config translation: rows, NeMo-only constants and harmless keys.

    :param rows: the translated keys.
    :param nemo_constants: NeMo fields with a fixed value for this family (dotted paths).
    :param harmless: keys of this family's ``config.json`` that do not change its math
        (added to :data:`HARMLESS_KEYS`).
    :param hf_constants: keys a synthesised ``config.json`` starts from
        (``architectures``, ``model_type``, fixed HF fields).
    """

    rows: tuple[Row, ...] = ()
    nemo_constants: Mapping[str, Any] = field(default_factory=dict)
    harmless: tuple[str, ...] = ()
    hf_constants: Mapping[str, Any] = field(default_factory=dict)

    def extend(self, *rows: Row, nemo_constants: Mapping[str, Any] | None = None,
               harmless: Iterable[str] = (), hf_constants: Mapping[str, Any] | None = None,
               drop: Iterable[str] = ()) -> "ConfigTable":
        """This table with more rows (a row for an HF key already translated replaces it),
        constants and harmless keys; ``drop`` removes the rows of those HF keys."""
        gone = set(drop)
        for r in rows:
            gone.update(r.hf_keys)
        checks = {r.name for r in rows if isinstance(r, NemoCheck)}
        kept = tuple(r for r in self.rows if not gone.intersection(r.hf_keys)
                     and not (isinstance(r, NemoCheck) and r.name in checks))
        return replace(self, rows=kept + rows, nemo_constants={**self.nemo_constants, **(nemo_constants or {})},
                       harmless=tuple(dict.fromkeys((*self.harmless, *harmless))),
                       hf_constants={**self.hf_constants, **(hf_constants or {})})

    def understood(self) -> set[str]:
        """Every ``config.json`` key this table accepts (translated, checked or harmless)."""
        keys = set(HARMLESS_KEYS) | set(self.harmless)
        for r in self.rows:
            keys.update(r.hf_keys)
        return keys

    def check_keys(self, hf: dict[str, Any], family: str) -> None:
        """Strictness: a key nobody understands fails the import, by name."""
        refuse_unknown_keys(hf, self.understood(), family)

    def to_nemo(self, hf: dict[str, Any], family: str) -> dict[str, Any]:
        """HF ``config.json`` → NeMo fields (strict)."""
        self.check_keys(hf, family)
        for r in self.rows:
            if isinstance(r, Check):
                reason = r.refuse(hf)
                if reason is not None:
                    raise UnsupportedError(f"{reason} (family {family} cannot represent it exactly)")
        missing = list(dict.fromkeys(r.hf for r in self.rows
                                     if isinstance(r, Field) and r.default is REQUIRED and not _present(hf, r.hf)))
        if missing:
            raise ConfigError(f"config.json lacks required field(s): {', '.join(missing)}")
        cfg: dict[str, Any] = {}
        for path, value in self.nemo_constants.items():
            set_path(cfg, path, copy.deepcopy(value))
        for r in self.rows:
            if isinstance(r, Field):
                value = hf.get(r.hf)
                if value is None:
                    value = r.default(hf) if callable(r.default) else copy.deepcopy(r.default)
                if r.accept is not None and not r.accept(value):
                    raise UnsupportedError(f"{r.hf}={value!r} is not supported by family {family}")
                set_path(cfg, r.nemo, r.to_nemo(value))
            elif isinstance(r, Derived):
                for path, value in r.to_nemo(hf).items():
                    set_path(cfg, path, value)
        return cfg

    def derived_hf(self, nemo: dict[str, Any], *, restoring: bool) -> dict[str, Any]:
        """The HF keys the rows derive from a NeMo config."""
        out: dict[str, Any] = {}
        for r in self.rows:
            if isinstance(r, Field) and r.to_hf is not None:
                value = cfg_get(nemo, r.nemo)
                if value is None and r.nemo_default is not None:
                    value = r.nemo_default(nemo)
                elif value is None and r.default is REQUIRED:
                    raise ConfigError(f"the NeMo config lacks {r.nemo} (needed for config.json {r.hf})")
                if value is not None:
                    out[r.hf] = r.to_hf(value)
            elif isinstance(r, Derived) and (r.restore or not restoring):
                out.update(r.to_hf(nemo))
        return out

    def always_written(self) -> set[str]:
        return {r.hf for r in self.rows if isinstance(r, Field) and r.always}

    def refuse_nemo(self, nemo: dict[str, Any]) -> str | None:
        """Why the family's HF class does not compute the NeMo config (its :class:`NemoCheck`
        rows, in order), or None."""
        for r in self.rows:
            if isinstance(r, NemoCheck):
                reason = r.refuse(nemo)
                if reason is not None:
                    return reason
        return None

    def to_hf(self, nemo: dict[str, Any]) -> dict[str, Any]:
        """NeMo config → HF ``config.json``: the recorded source restored (NeMo's fields
        win where the table derives them), else a synthesised config."""
        original = provenance_of(nemo).hf_config
        if original is not None:
            out = copy.deepcopy(original)
            always = self.always_written()
            for k, v in self.derived_hf(nemo, restoring=True).items():
                if k in out or k in always:
                    out[k] = v
            return out
        return {**copy.deepcopy(dict(self.hf_constants)), **self.derived_hf(nemo, restoring=False)}
