"""Typed records that plugins return from their hooks.

Records are frozen dataclasses: plugins *declare* what they provide; the core does all
tensor work. A record never holds open files or tensors.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol, Sequence, Union, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from nemo_convert.families.trtllm import TrtllmTable
    from nemo_convert.formats.megatron.providers import ProviderFamily
    from nemo_convert.formats.megatron.providers import ProviderTable
    from nemo_convert.mapping.planner import Plan
    from nemo_convert.mapping.rules import Kind, Mapping
    from nemo_convert.sharding.protocol import ExpertSharding, PipelineSharding, Strategies, TensorSharding
    from nemo_convert.tensors.base import TensorSource


#: the HF tokenizer files a family keeps unless it names its own (:attr:`HFSide.tokenizer_files`)
DEFAULT_TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.model",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


@dataclass(frozen=True)
class NemoTarget:
    """The NeMo side of a family: which model class it writes and reads, and how NeMo lays
    its weights out.

    :param target: the NeMo model class written to ``model_config.yaml`` ``target`` (also
        how a ``.nemo`` NeMo wrote is recognised).
    :param nemo2_targets: NeMo 2.0 model classes (``_target_`` of ``context/model.yaml``)
        this family reads.
    :param nemo2_configs: the NeMo 2.0 config classes (``config._target_`` of
        ``context/model.yaml``) this family reads, each with the field defaults that class
        has — its own and those it inherits from the family's classes, in the
        Megatron-Core ``TransformerConfig`` / Megatron-Bridge provider field names; NeMo's
        ``GPTConfig`` and ``TransformerConfig`` defaults under them are the core's. NeMo 2
        writes only the arguments a config class was called with (``IOMixin``, NeMo 8cfedd7
        ``nemo/lightning/io/mixin.py`` lines 520-545), so an absent field is this default. A
        ``_target_`` entry names the Megatron-Bridge provider class the config is read as
        (its class defaults and implied NeMo fields apply under the declared ones). A string
        instead of a mapping is why that class is refused, by name. A class under one of
        ``nemo2_targets`` that no family declares is refused by name.
    :param default_layout: ``"dist"`` (Megatron-Core distributed checkpoint) or
        ``"legacy"`` (one ``model_weights.ckpt``), the layout NeMo itself uses.
    :param dist_unstacked: logical-name prefixes that the dist layout stores one key per
        layer instead of stacking (modules NeMo keeps per layer, like NeVA's HF tower).
    :param dist_extra_states: modules outside the layers whose ``_extra_state`` the model
        class saves in a dist checkpoint (Megatron-Core's ``MambaModel`` keeps its
        ``output_layer``'s; ``GPTModel`` drops it)
    :param runtime_defaults: ``defaults(cfg) -> keys``: the runtime keys ``target`` reads at
        construction beyond what NeMo's shared classes need (its example config's
        optimizer, data and fusion sections; :mod:`nemo_convert.families.nemo_runtime` has
        the shared pieces), added to the written ``model_config.yaml`` where absent so that
        NeMo restores it. None: ``MegatronGPTModel``'s for that class, the Megatron base
        for another ``…Megatron*`` class.
    :param restore_warnings: ``warnings(cfg) -> lines``: what ``target`` loads from outside the
        ``.nemo`` when NeMo restores it (a vision tower named by hub id, …), one line each,
        reported by ``import``; the core adds the tokenizer's.
    """

    target: str
    nemo2_targets: tuple[str, ...] = ()
    nemo2_configs: "dict[str, dict[str, Any] | str]" = field(default_factory=dict, hash=False)
    default_layout: Literal["dist", "legacy"] = "dist"
    dist_unstacked: tuple[str, ...] = ()
    dist_extra_states: tuple[str, ...] = ()
    runtime_defaults: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    restore_warnings: Callable[[dict[str, Any]], list[str]] | None = None


@dataclass(frozen=True)
class HFSide:
    """The Hugging Face side of a family beyond its tensors and ``config.json``.

    :param model_class: the name of the ``transformers`` model class that loads the
        family's HF checkpoints (default ``AutoModelForCausalLM``); ``quantize`` runs it to
        calibrate.
    :param tokenizer_files: HF tokenizer file names that travel with the model.
    :param add_tokens: tokens added to the SentencePiece tokenizer on import (NeVA adds
        ``<extra_id_0>`` …); the vocabulary change is reported, embeddings are not resized.
    """

    model_class: str = "AutoModelForCausalLM"
    tokenizer_files: tuple[str, ...] = DEFAULT_TOKENIZER_FILES
    add_tokens: tuple[str, ...] = ()


@dataclass(frozen=True)
class FamilyOptions:
    """The family-specific import options ``config_to_nemo`` accepts, and where they come from.

    :param keys: names of the keyword options ``config_to_nemo`` accepts
        (``--option KEY=VALUE``; e.g. ``("embed_vision_tower",)``); others are refused.
    :param cli: command-line switches for some of them (:class:`CommandOption` with
        ``command="import"``; its ``key`` one of ``keys``): the CLI adds each to ``import``
        and passes a given one as the import option ``key`` (LLaVA's
        ``--embed-vision-tower``).
    :param from_source: ``from_source(hf_config, source_tensor_names) -> options``:
        options derived from the checkpoint itself (e.g. which key spelling it uses),
        passed to ``config_to_nemo`` under the user's explicit options.
    """

    keys: tuple[str, ...] = ()
    cli: tuple["CommandOption", ...] = ()
    from_source: "Callable[[dict[str, Any], Sequence[str]], dict[str, Any]] | None" = None


@dataclass(frozen=True)
class ModelFamily:
    """A model family: how one kind of HF model maps onto one kind of NeMo model.

    What recognises the family's checkpoints:

    :param name: unique short name, used by ``--family`` (e.g. ``"llama"``).
    :param hf_architectures: values of ``config.json`` ``architectures`` this family handles.
    :param hf_model_types: values of ``config.json`` ``model_type`` this family handles.
    :param claims_nemo_config: for a ``.nemo`` NeMo wrote (no record of its family) whose
        ``target`` several families share: does this config look like this family's
        (Gemma: ``apply_embedding_scaling``)? ``None``: the family is the default for its
        target (Llama for ``MegatronGPTModel``).
    :param description: one line for ``nemo-convert plugins``.
    :param refuses_nemo_config: ``refuse(nemo_config)``: why the family's HF class does not
        compute a NeMo config (one line naming the field), or None. Export refuses such a
        config, and choosing a family for a NeMo-native config skips the families that
        refuse it (and lists each one's reason when all do). ``None``: no check.

    What it translates:

    :param mapping: builds the key mapping (rules as data) for a NeMo config. Called
        with the NeMo config so rules can depend on it (``when=`` conditions on the typed
        model spec, ``SpecField``, are the usual way; a function is an escape hatch).
    :param config_to_nemo: HF ``config.json`` dict → NeMo ``model_config.yaml`` dict.
    :param config_to_hf: NeMo config dict → HF ``config.json`` dict (export).

    Its targets and options:

    :param nemo: the NeMo side (:class:`NemoTarget`: model class, NeMo 2.0 classes, layout).
    :param hf: the HF side (:class:`HFSide`: transformers class, tokenizer files, added
        tokens); default :class:`HFSide()`.
    :param options: family-specific import options (:class:`FamilyOptions`); default none.
    :param trtllm: optional :class:`~nemo_convert.families.trtllm.TrtllmTable` for
        ``quantize``: NeMo logical names → TensorRT-LLM names and config fields (the GPT
        base's for a confirmed GPT-base family; the HF side comes from ``mapping``).
    :param megatron_bridge: what ``--to megatron-bridge`` writes: a
        :class:`~nemo_convert.formats.megatron.providers.ProviderFamily` (the family's
        Megatron-Bridge provider, confirmed against Megatron-Bridge's bridge for it), a
        string (why the family is refused), or ``None`` (refused: no confirmed provider).
    """

    name: str
    hf_architectures: tuple[str, ...]
    hf_model_types: tuple[str, ...]
    nemo: NemoTarget
    mapping: "Callable[[dict[str, Any]], Mapping]"
    config_to_nemo: Callable[[dict[str, Any]], dict[str, Any]]
    config_to_hf: Callable[[dict[str, Any]], dict[str, Any]]
    hf: HFSide = HFSide()
    options: FamilyOptions = FamilyOptions()
    trtllm: "TrtllmTable | None" = None
    megatron_bridge: "ProviderFamily | str | None" = None
    description: str = ""
    claims_nemo_config: Callable[[dict[str, Any]], bool] | None = None
    refuses_nemo_config: Callable[[dict[str, Any]], str | None] | None = None


@dataclass(frozen=True)
class TokenizerPatcher:
    """Adds tokens to one kind of tokenizer.

    :param name: unique short name (e.g. ``"sentencepiece"``).
    :param detect: ``detect(path) -> bool``: does this patcher handle that file/folder?
    :param add_tokens: ``add_tokens(src, dst, tokens, options) -> report`` writes a
        patched copy of ``src`` at ``dst`` (the core stages and renames ``dst``).
    :param description: one line for ``nemo-convert plugins``.
    """

    name: str
    detect: Callable[[str], bool]
    add_tokens: Callable[[str, str, Sequence[str], dict[str, Any]], Any]
    description: str = ""


@dataclass(frozen=True)
class ShardingStrategy:
    """How global tensors split across the ranks of one parallel axis and merge back.
    Every reader and writer of a sharded layout uses the registry's strategy of each axis.

    :param name: unique short name (``"tensor"``, ``"pipeline"``, ``"expert"``).
    :param axis: which parallel axis it handles: ``"tp"``, ``"pp"`` or ``"ep"``.
    :param implementation: the object doing the work, with the methods of the axis's
        protocol (:mod:`nemo_convert.sharding.protocol`: ``TensorSharding``,
        ``PipelineSharding``, ``ExpertSharding``); the registry refuses, when it is built,
        one whose methods cannot take the core's calls.
    :param description: one line for ``nemo-convert plugins``.
    """

    name: str
    axis: str
    implementation: "TensorSharding | PipelineSharding | ExpertSharding" = field(repr=False)
    description: str = ""


OptionKind = Literal["switch", "value", "values"]


@dataclass(frozen=True)
class CommandOption:
    """A command-line option a plugin adds to one ``nemo-convert`` command.

    :param command: the command (``"import"``, ``"verify"``).
    :param flag: its spelling (``"--embed-vision-tower"``); the keyword it is passed on
        as is :attr:`key` (``embed_vision_tower``).
    :param help: one line for ``--help`` and docs/cli.md.
    :param kind: ``"switch"`` (true when given), ``"value"`` (one string) or ``"values"``
        (one or more strings).
    :param metavar: the value's name in ``--help``.
    """

    command: str
    flag: str
    help: str
    kind: OptionKind = "switch"
    metavar: str | None = None

    @property
    def key(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class ResultTable:
    """A table in a verifier's text report (:class:`VerifierResult`): the core draws it
    like its own tables, every cell as plain text (no markup).

    :param title: the line above the table.
    :param columns: the column headers.
    :param rows: the cells, one tuple of strings per row.
    """

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


#: One item of a verifier's text report: a line (printed indented, as plain text) or a table.
ReportItem = Union[str, ResultTable]


@runtime_checkable
class VerifierResult(Protocol):
    """What a verifier's result may implement to be shown by ``verify`` without the core
    knowing the verifier. Both methods are optional:

    * ``render() -> Sequence[str | ResultTable]``: the text report's items, in order (lines
      are printed indented by two spaces). Without it, a ``dict`` result (or the fields of
      any other object) is printed one ``key: value`` line each under the verifier's name.
    * ``as_dict() -> dict``: what ``--json`` prints under ``extra.<name>``. Without it, a
      plain ``dict`` is printed as it is and another object as its fields (``vars``).
    """

    def render(self) -> Sequence[ReportItem]:
        ...


@dataclass(frozen=True)
class Verifier:
    """An extra check ``verify`` runs on both checkpoints when its options are given
    (CLIP's zero-shot probabilities). Informational: it never changes ``ok``.

    :param name: unique short name; its result is ``VerifyReport.extra[name]``.
    :param options: the ``verify`` options it reads (:class:`CommandOption` with
        ``command="verify"``); it runs when any of them is given.
    :param run: ``run(hf_folder_a, hf_folder_b, options) -> result``: both sides as HF
        folders (a ``.nemo`` side is exported to a temporary folder first); ``options``
        holds its given options by key. The result is shown generically
        (:class:`VerifierResult`): a record with ``render()`` / ``as_dict()``, or a plain
        ``dict`` that ``--json`` prints as it is.
    :param check: ``check(options)`` refuses bad options (``InputError``) before any
        checkpoint is opened.
    :param description: one line for ``nemo-convert plugins``.
    """

    name: str
    options: tuple[CommandOption, ...]
    run: Callable[[str, str, dict[str, Any]], Any]
    check: Callable[[dict[str, Any]], None] | None = None
    description: str = ""


#: The options of a conversion that only some targets take (:attr:`OutputTarget.options`);
#: ``"quantization"``: the target needs :class:`QuantSettings` (``OutputJob.quantization``).
TargetOption = Literal["layout", "packed", "workers", "quantization"]


@dataclass(frozen=True)
class QuantSettings:
    """How a target that quantizes (``--to trtllm``, what ``nemo-convert quantize`` writes)
    is asked to quantize: the options of ``quantize``, in one record on the job
    (:attr:`OutputJob.quantization`). TP × PP × EP, ``--compress`` (``packed``), the
    processes and ``--overwrite`` are the job's own fields.

    :param algo: ``none``, ``int8_wo``, ``int4_wo``, ``fp8`` or ``int4_awq``.
    :param kv_cache: ``none`` or ``fp8`` (calibrated FP8 KV-cache scales).
    :param group_size: the int4 group size (64 or 128).
    :param dtype: the checkpoint's ``torch.dtype``; None: the source's.
    :param device: the ``torch.device`` calibration and the quantization math run on.
    :param calib_data: a text file, one calibration sample per line (None: the built-in sample).
    :param calib_size: calibration rows; ``calib_seq_len`` tokens per row (None: sized to
        the model and the device); ``calib_batch_size`` rows per forward.
    :param awq_grid: the points of AWQ's α search.
    """

    algo: str
    kv_cache: str = "none"
    group_size: int = 128
    dtype: Any = None
    device: Any = "cpu"
    calib_data: str | None = None
    calib_size: int | None = None
    calib_seq_len: int | None = None
    calib_batch_size: int = 4
    awq_grid: int = 20


@dataclass(frozen=True)
class RunnableModel:
    """The model as transformers loads it, for a target that runs it (the ``trtllm``
    target calibrates with it): set by a conversion that can give it (``quantize``).

    :param config: the ``config.json`` transformers reads: an HF source's own; for a NeMo
        source the one ``export`` writes of it.
    :param folder: ``folder(dtype, scratch) -> context manager of (path, config)``: an HF
        folder of the model (an HF source's own, or ``export`` of the source written under the
        folder ``scratch`` and removed on exit) and the ``config.json`` it holds.
    :param ignore_config_keys: the ``config.json`` keys the NeMo config was translated
        without (``--ignore-config-key``); the loaded model's config is read the same way.
    """

    config: dict[str, Any]
    folder: Callable[[Any, str], AbstractContextManager[tuple[str, dict[str, Any]]]]
    ignore_config_keys: tuple[str, ...] = ()


@runtime_checkable
class WriteStats(Protocol):
    """What a target's writer returns (the engine's ``RunStats`` is one): the report of
    every conversion is built from it."""

    tensors: int
    bytes: int
    seconds: float
    warnings: list[str]
    non_finite: dict[str, int]


@dataclass(frozen=True)
class OutputJob:
    """Everything one conversion hands the target it writes (:attr:`OutputTarget.write`):
    the planned tensors and the config, and what the command was asked. ``import``,
    ``export``, ``reshard``, ``from-ckpt`` and ``quantize`` each open their source, pick the
    family and plan; the one output step (:mod:`nemo_convert.convert.output`) builds this record.

    :param command: which conversion runs it: ``"import"``, ``"export"``, ``"reshard"``,
        ``"from-ckpt"`` or ``"quantize"``.
    :param out: the path to write (checked writable before the source was opened).
    :param cfg: the NeMo config of the model (``model_config.yaml``'s content; a writer
        may complete it).
    :param plan: the checked plan: each output tensor under its NeMo logical name.
    :param source: the tensors the plan reads.
    :param family: the model family of the checkpoint.
    :param kinds: each NeMo logical name's parallel kind (how it splits across TP ranks).
    :param tp, pp, ep: the target parallelism; ``stage_layers`` explicit pipeline stage
        sizes (None: an even split).
    :param strategies: the registry's sharding strategies (``Registry.strategies()``).
    :param providers: the registry's Megatron-Bridge providers (``Registry.providers()``).
    :param layout: the ``.nemo`` weights layout (``"dist"`` / ``"legacy"``); a target
        without the ``"layout"`` option ignores it.
    :param packed: one archive file (True) or the unpacked folder form.
    :param overwrite: replace an existing output (it was checked to be one of the target's
        kind).
    :param progress: a :class:`nemo_convert.engine.Progress`, or None.
    :param workers: the process group (:class:`nemo_convert.workers.Workers`); more than one
        process only for a target with the ``"workers"`` option.
    :param compute: where transforms run (:class:`nemo_convert.compute.Compute`).
    :param artifacts: ``artifacts() -> [(member, bytes)]``: the non-weight members a
        ``.nemo`` holds, already referenced from ``cfg`` (a call: only a target that stores
        them reads them, and reading may update ``cfg``).
    :param tokenizer: ``tokenizer() -> {file name: bytes}``: the source's tokenizer files
        (a call, read only by a target that stores them; it may append the tokenizer's own
        notes and warnings to ``notes``/``warnings``).
    :param notes: the report's notes so far; the writer appends its own.
    :param warnings: the report's warnings so far; the writer appends its own.

    What only a target that re-plans under another side's names reads (the ``hf`` target;
    the others ignore them):

    :param dtype: cast the floating outputs to this ``torch.dtype`` (export's ``--dtype``;
        None: keep).
    :param max_shard_bytes: the largest weights file (export's ``--max-shard-size``; None:
        the target's default).
    :param rope_scaling: write NeMo's ``scale_positional_embedding: True`` as the llama3
        RoPE scaling NeMo runs (export's default; ``--no-rope-scaling`` sets False).
    :param hf_defaults: the ``config.json`` keys the source tells where the family's table
        leaves one out (:func:`nemo_convert.convert.export_config.complete_config`); None:
        the ones the NeMo config itself tells (precision, tied embeddings, vocabulary).
    :param dropped: the source tensors the target's own plan leaves out (the report's
        ``dropped``); the writer appends them.

    What only a target with the ``"quantization"`` option reads (``trtllm``):

    :param quantization: the quantization asked for (:class:`QuantSettings`); a conversion
        without it is refused such a target up front
        (:func:`~nemo_convert.convert.output.choose_target`).
    :param model: the model as transformers runs it, for calibration (:class:`RunnableModel`).
    """

    command: str
    out: str
    cfg: dict[str, Any]
    plan: "Plan"
    source: "TensorSource"
    family: ModelFamily
    kinds: "dict[str, Kind]"
    strategies: "Strategies"
    providers: "ProviderTable"
    tp: int = 1
    pp: int = 1
    ep: int = 1
    stage_layers: tuple[int, ...] | None = None
    layout: str | None = None
    packed: bool = True
    overwrite: bool = False
    progress: Any = None
    workers: Any = None
    compute: Any = None
    artifacts: Callable[[], Sequence[tuple[str, bytes]]] = lambda: ()
    tokenizer: Callable[[], dict[str, bytes]] = lambda: {}
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dtype: Any = None
    max_shard_bytes: int | None = None
    rope_scaling: bool = True
    hf_defaults: dict[str, Any] | None = None
    dropped: list[str] = field(default_factory=list)
    quantization: QuantSettings | None = None
    model: RunnableModel | None = None


@dataclass(frozen=True)
class OutputTarget:
    """Something a conversion can write (``--to NAME``): a ``.nemo``, a Megatron-Bridge
    directory, or a third party's format. Every conversion reaches every target through
    one step: the target is checked before the source is opened, then its ``write`` gets
    an :class:`OutputJob`.

    :param name: unique short name, the value of ``--to`` (``"nemo"``, ``"megatron-bridge"``).
    :param kind: the output kind ``--overwrite`` checks an existing output against (one of
        ``KIND_NAMES`` in :mod:`nemo_convert.formats.io.replace`: ``"nemo"``,
        ``"megatron-bridge"``, ``"hf"``, …); checked when the registry is built.
    :param write: ``write(job) -> stats``: writes ``job.out`` completely (staged and renamed
        into place) and returns a :class:`WriteStats`; refusals are one-line
        ``UnsupportedError``/``ConfigError`` raised before anything is written.
    :param options: which of the options that only some targets take it honours
        (``"layout"``, ``"packed"``, ``"workers"``, ``"quantization"``); a conversion given
        one it does not take (``--layout``, several processes, quantization settings) is
        refused up front, and so is one without quantization settings for a target that
        needs them (``--to trtllm`` from ``import`` or ``reshard``).
    :param directory: whether the output is a folder when ``"packed"`` is not among
        ``options`` (with it, a folder exactly when not packed).
    :param description: one line for ``nemo-convert plugins``.
    """

    name: str
    kind: str
    write: Callable[[OutputJob], WriteStats]
    options: frozenset[TargetOption] = frozenset()
    directory: bool = True
    description: str = ""

    def is_dir(self, packed: bool) -> bool:
        """Whether the output is a folder, for ``packed`` as the conversion was asked."""
        return not packed if "packed" in self.options else self.directory
