"""NeMo itself must load what we write (issue 12): every ``model_config.yaml`` we write has
the keys NeMo's model classes read at construction, with the types they need.

NeMo restores a ``.nemo`` with ``OmegaConf.set_struct(conf, True)`` and then builds the
target class from it (``nemo/core/connectors/save_restore_connector.py`` L184-188): a key
read as an attribute (``cfg.optim``) that is missing raises ``ConfigAttributeError``, one
read with ``cfg.get(key, default)`` falls back to the default. The lists below are taken
from NeMo's source at

    NVIDIA/NeMo @ 379b87679df2fb44509687b18be842ace70f0718 (2025-08-05; NeMo 2.4.x code,
    the last with ``nemo.collections.nlp``'s MegatronGPTModel and the NeMo-1 multimodal models)

with file and line per group. ``emulate_*`` replay those constructors' reads on our
config in struct mode (a small stand-in below, and OmegaConf itself where it is installed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tarfile
from typing import Any, Callable

import pytest
import yaml
from tiny_models import make_tiny_llama

from nemo_convert import NemoTarget, api
from nemo_convert.convert.nemo_defaults import complete_nemo_config, defaults_for
from nemo_convert.errors import PluginError
from nemo_convert.families.nemo_runtime import GPT_TARGET, SHARED_DEFAULTS
from nemo_convert.plugins.hookspecs import hookimpl
from nemo_convert.plugins.manager import get_registry, registry_with

#: what the CLIP and LLaVA plugins declare for their NeMo classes
DECLARED = get_registry().nemo_runtime_defaults()
CLIP_TARGET = get_registry().family("clip").nemo.target
NEVA_TARGET = get_registry().family("llava").nemo.target

N = "NVIDIA/NeMo@379b876"
MBM = f"{N}:nemo/collections/nlp/models/language_modeling/megatron_base_model.py"
GPT = f"{N}:nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py"
CLIP = f"{N}:nemo/collections/multimodal/models/vision_language_foundation/clip/megatron_clip_models.py"
NEVA = f"{N}:nemo/collections/multimodal/models/multimodal_llm/neva/neva_model.py"
MPT = f"{N}:nemo/core/classes/modelPT.py"

# ------------------------------------------------------------------------------ the pins
#: (dotted key, type) that MegatronBaseModel.__init__ and what it calls read by attribute
#: (or whose absence breaks construction), for every Megatron target.
BASE_REQUIRED: list[tuple[str, type | tuple[type, ...], str]] = [
    ("target", str, f"{MPT} L123-126 (class to build; added if missing)"),
    ("optim", dict, f"{MBM} L151-153, L206 cfg.optim.get(...); L1032-1033 _validate_and_override_config"),
    ("optim.name", str, f"{MBM} L151-153 compared with the optimizer names"),
    ("optim.sched", dict, f"{MBM} L912-913, L920 configure_optimizers reads optim.sched"),
    ("precision", (int, str), f"{MBM} L121-128 (else taken from the trainer)"),
    ("tokenizer", dict, f"{MBM} L227-234: no tokenizer → no _build_vocab → no padded_vocab_size"),
    ("tokenizer.library", str, f"{MBM} L452-454 _build_tokenizer: self._cfg.tokenizer.library"),
    ("tokenizer.type", (str, type(None)), "NVIDIA/NeMo@v1.22.0 megatron_base_model.py L268: "
     "self._cfg.tokenizer.type (an attribute read there; .get since)"),
]
#: MegatronGPTModel (Llama; and NeVA, its subclass).
GPT_REQUIRED = BASE_REQUIRED + [
    ("data", dict, f"{GPT} L356-359 cfg.data.get(...) when present; L459-461"),
    ("hidden_size", int, f"{MBM} L1264 build_model_parallel_config: self.cfg.hidden_size"),
]
CLIP_REQUIRED = BASE_REQUIRED + [
    ("text", dict, f"{CLIP} L686, L775 build_transformer_config(self.cfg.text)"),
    ("vision", dict, f"{CLIP} L774 build_transformer_config(self.cfg.vision)"),
    ("output_dim", int, f"{CLIP} L499, L528, L547 model_cfg.output_dim"),
]
NEVA_REQUIRED = GPT_REQUIRED + [
    ("mm_cfg", dict, f"{NEVA} L739-740, L759, L774 self.cfg.mm_cfg"),
    ("mm_cfg.llm", dict, f"{NEVA} L485, L488, L759, L869"),
    ("mm_cfg.llm.freeze", bool, f"{NEVA} L488 NevaBaseModel; L869 setup_optimizer_param_groups"),
    ("mm_cfg.vision_encoder", dict, f"{NEVA} L519-551, L740"),
    ("mm_cfg.vision_encoder.from_pretrained", str, f"{NEVA} L522, L550"),
    ("mm_cfg.vision_encoder.freeze", bool, f"{NEVA} L529, L539, L551"),
    ("mm_cfg.vision_encoder.hidden_size", int, f"{NEVA} L740 adapter in_features"),
]
REQUIRED = {GPT_TARGET: GPT_REQUIRED, CLIP_TARGET: CLIP_REQUIRED, NEVA_TARGET: NEVA_REQUIRED}

#: Keys read with ``cfg.get(key, default)`` whose *code* default is not our models' value,
#: so they must be written (a missing one silently builds another model).
GPT_WRITTEN = {
    "mcore_gpt": (True, f"{GPT} L344 default False: the legacy (non-mcore) GPTModel"),
    "transformer_engine": (True, f"{GPT} L386 default False: another layer spec"),
    "share_embeddings_and_output_weights": (None, f"{GPT} L506 default True"),
    "position_embedding_type": ("rope", f"{GPT} L507 default learned_absolute"),
    "bias": (None, f"{MBM} L510 default True"),
    "activation": ("fast-swiglu", f"{MBM} L513 default gelu"),
    "normalization": ("rmsnorm", f"{MBM} L518 default LayerNorm"),
    "encoder_seq_length": (None, f"{GPT} L502 default 512"),
    "make_vocab_size_divisible_by": (None, f"{MBM} L630 default 128"),
    "use_cpu_initialization": (True, f"{MBM} L158: False calls torch.cuda.set_device (no CPU restore)"),
}
#: ...and the runtime keys NeMo's Llama converter writes (megatron_llama_config.yaml, the
#: fusion and fp8 flags among them), so that a NeMo user sees a familiar config.
GPT_FAMILIAR = ("nsys_profile", "seed", "bias_activation_fusion", "bias_dropout_add_fusion",
                "gradient_accumulation_fusion", "get_attention_mask_from_fusion", "fp8", "fp8_hybrid",
                "fp8_amax_history_len", "sequence_parallel", "activations_checkpoint_granularity",
                "native_amp_init_scale", "apply_query_key_layer_scaling", "kv_channels")


# ------------------------------------------------------------------------------ struct mode
class MissingKey(AttributeError, KeyError):
    """OmegaConf's ``ConfigAttributeError``/``ConfigKeyError`` for a key not in a struct."""


class Struct:
    """OmegaConf struct mode as NeMo relies on it: attribute and item reads of a missing key
    raise, ``get(key, default)`` returns the default, ``in`` and ``hasattr`` test presence."""

    def __init__(self, data: dict[str, Any], path: str = "") -> None:
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_path", path)

    def _wrap(self, key: str, value: Any) -> Any:
        return Struct(value, f"{self._path}{key}.") if isinstance(value, dict) else value

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        if key not in self._data:
            raise MissingKey(f"Key '{key}' is not in struct (full_key: {self._path}{key})")
        return self._wrap(key, self._data[key])

    __getitem__ = __getattr__

    def get(self, key: str, default: Any = None) -> Any:
        return self._wrap(key, self._data[key]) if key in self._data else default

    def __contains__(self, key: str) -> bool:
        return key in self._data


def as_struct(cfg: dict[str, Any], kind: str) -> Any:
    if kind == "omegaconf":
        omegaconf = pytest.importorskip("omegaconf")
        conf = omegaconf.OmegaConf.create(cfg)
        omegaconf.OmegaConf.set_struct(conf, True)
        return conf
    return Struct(cfg)


# ------------------------------------------------------------------------------ the reads
def emulate_megatron_base(cfg: Any) -> None:
    """``ModelPT.__init__`` and ``MegatronBaseModel.__init__``'s reads, in order."""
    assert "model" not in cfg  # modelPT.py L118-121: a key named model is refused
    assert not cfg.get("use_flash_attention", False)  # mbm L111: needs the flash-attn package
    cfg.precision  # mbm L123-128
    cfg.optim.get("name")  # mbm L151-153
    assert cfg.get("use_cpu_initialization", False) is True  # mbm L158 (CPU restore)
    vp = cfg.get("virtual_pipeline_model_parallel_size", None)  # mbm L181
    if vp not in (None, 1):
        cfg.num_layers // cfg.pipeline_model_parallel_size  # mbm L190-193
    cfg.optim.get("num_distributed_optimizer_instances", 1)  # mbm L206
    cfg.optim.get("name", "fused_adam")  # mbm L1032-1033
    assert hasattr(cfg, "tokenizer")  # mbm L227
    legacy = cfg.tokenizer.library == "sentencepiece"  # mbm L449-452
    assert cfg.tokenizer.library in ("sentencepiece", "huggingface")  # mbm L454
    if legacy:
        assert isinstance(cfg.tokenizer.get("model", None), str)  # mbm L456: the SentencePiece model
    else:
        assert isinstance(cfg.tokenizer.get("type", None), str)  # mbm L455: model_name
    for key in ("vocab_file", "merge_file", "use_fast", "delimiter", "special_tokens", "trust_remote_code"):
        cfg.tokenizer.get(key, None)  # mbm L457-462
    cfg.get("make_vocab_size_divisible_by", 128)  # mbm L630
    getattr(cfg.optim, "sched", None)  # mbm L920 (configure_optimizers)
    cfg.optim.sched.get("name")


def emulate_megatron_gpt(cfg: Any) -> None:
    emulate_megatron_base(cfg)
    cfg.hidden_size  # mbm L1264
    assert cfg.get("mcore_gpt", False) is True  # gpt L344
    if cfg.get("data", None) is not None:  # gpt L356-359
        cfg.data.get("reset_position_ids", False)
        cfg.data.get("eod_mask_loss", False)
    cfg.optim.get("overlap_param_gather_with_optimizer_step", False)  # gpt L374
    cfg.optim.get("overlap_param_sync", False)  # gpt L383
    cfg.get("data", {}).get("validation_drop_last", True)  # gpt L459-461
    for key in ("encoder_seq_length", "share_embeddings_and_output_weights", "position_embedding_type",
                "rotary_percentage", "seq_len_interpolation_factor", "rotary_base"):
        cfg.get(key, None)  # gpt L501-510 model_provider_func (mcore)
    cfg.get("scale_positional_embedding", False)  # gpt L197 mcore_model_customize


def emulate_megatron_clip(cfg: Any) -> None:
    emulate_megatron_base(cfg)
    cfg.text.get("normalization", "layernorm")  # clip L686 → L1500 build_transformer_config(text)
    cfg.vision.get("normalization", "layernorm")  # clip L774
    cfg.output_dim  # clip L499
    cfg.vision.get("class_token_length")  # clip L503
    cfg.vision.get("patch_dim", 16), cfg.vision.get("img_h", 224)  # clip L523-524
    cfg.text.get("encoder_seq_length", 512)  # clip L538
    cfg.get("data", {}).get("validation_drop_last", True)  # clip L766-768


def emulate_megatron_neva(cfg: Any) -> None:
    emulate_megatron_gpt(cfg)
    mm = cfg.mm_cfg
    mm.llm.get("model_type", "nvgpt")  # neva L759
    mm.llm.from_pretrained  # neva L485
    mm.llm.freeze  # neva L488
    if mm.vision_encoder.get("from_hf", False):  # neva L519
        assert isinstance(mm.vision_encoder.from_pretrained, str)  # neva L522
        mm.vision_encoder.freeze  # neva L529
    mm.get("mm_mlp_adapter_type", "linear")  # neva L739
    mm.vision_encoder.hidden_size  # neva L740
    cfg.hidden_size  # neva L741
    cfg.mm_cfg.llm.freeze  # neva L869


EMULATE: dict[str, Callable[[Any], None]] = {GPT_TARGET: emulate_megatron_gpt, CLIP_TARGET: emulate_megatron_clip,
                                             NEVA_TARGET: emulate_megatron_neva}


# ------------------------------------------------------------------------------ helpers
def model_config(nemo: str) -> dict[str, Any]:
    if os.path.isdir(nemo):
        with open(os.path.join(nemo, "model_config.yaml")) as f:
            return yaml.safe_load(f)
    with tarfile.open(nemo) as t:
        name = next(n for n in t.getnames() if n.endswith("model_config.yaml"))
        return yaml.safe_load(t.extractfile(name))  # type: ignore[arg-type]


def lookup(cfg: dict[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        assert isinstance(node, dict) and part in node, f"missing {dotted}"
        node = node[part]
    return node


def check_loadable(cfg: dict[str, Any]) -> None:
    """Everything this file pins, on one written config."""
    target = cfg["target"]
    for key, typ, where in REQUIRED[target]:
        value = lookup(cfg, key)
        assert isinstance(value, typ), (key, value, where)
        assert typ is bool or not isinstance(value, bool), (key, value, where)
    if target in (GPT_TARGET, NEVA_TARGET):
        for key, (want, where) in GPT_WRITTEN.items():
            assert key in cfg, (key, where)
            if want is not None:
                assert cfg[key] == want, (key, cfg[key], where)
        for key in GPT_FAMILIAR:
            assert key in cfg, key
    assert list(cfg)[-1] == "nemo_convert" or "nemo_convert" not in cfg
    for kind in ("struct", "omegaconf"):
        if kind == "omegaconf":
            try:
                import omegaconf  # noqa: F401
            except ImportError:
                continue
        EMULATE[target](as_struct(cfg, kind))


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def llama_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("restore")
    out = {}
    for tied in (False, True):
        hf = make_tiny_llama(str(base / f"hf_tied{tied}"), tie_word_embeddings=tied)
        out[f"hf_{tied}"] = hf
        for layout in ("dist", "legacy"):
            out[f"{layout}_{tied}"] = str(base / f"{layout}_tied{tied}.nemo")
            api.import_hf(hf, out[f"{layout}_{tied}"], layout=layout)
    out["base"] = str(base)
    return out


# ------------------------------------------------------------------------------ tests
def test_every_family_target_has_defaults_and_pins():
    """A family whose NeMo class has no row here would write a config NeMo cannot build."""
    for provided in get_registry().families.values():
        target = provided.record.nemo.target
        assert defaults_for(target, DECLARED) is not None, target
        if target in DECLARED or target in SHARED_DEFAULTS:
            assert target in REQUIRED and target in EMULATE, target


@pytest.mark.parametrize("layout", ["dist", "legacy"])
@pytest.mark.parametrize("tied", [False, True])
def test_llama_import_loads_in_nemo(llama_files, layout, tied):
    cfg = model_config(llama_files[f"{layout}_{tied}"])
    check_loadable(cfg)
    assert cfg["share_embeddings_and_output_weights"] is tied
    assert cfg["kv_channels"] is None  # head_dim = hidden / heads, written as NeMo writes it
    assert cfg["apply_query_key_layer_scaling"] is True
    assert cfg["data"]["seq_length"] == cfg["encoder_seq_length"]


def test_explicit_head_dim_stays_explicit_and_exports_back(tmp_path, tiny_llama):
    hf = tiny_llama(head_dim=24)
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(hf, nemo)
    cfg = model_config(nemo)
    assert cfg["kv_channels"] == 24
    check_loadable(cfg)
    back = str(tmp_path / "back")
    api.export_hf(nemo, back)
    with open(os.path.join(hf, "config.json")) as a, open(os.path.join(back, "config.json")) as b:
        assert json.load(a) == json.load(b)


def test_null_kv_channels_exports_config_json_key_for_key(llama_files, tmp_path):
    back = str(tmp_path / "back")
    api.export_hf(llama_files["dist_False"], back)
    with open(os.path.join(llama_files["hf_False"], "config.json")) as a, \
            open(os.path.join(back, "config.json")) as b:
        assert json.load(a) == json.load(b)


def test_family_values_win_over_defaults(llama_files):
    cfg = model_config(llama_files["dist_False"])
    # Llama writes these itself; NeMo's example config has other values
    assert (cfg["micro_batch_size"], cfg["global_batch_size"]) == (1, 1)
    assert cfg["make_vocab_size_divisible_by"] != 128 or cfg["nemo_convert"]["vocab_size"] % 128 == 0
    assert cfg["optim"] == {"name": "fused_adam", "lr": 2e-4, "weight_decay": 0.01, "betas": [0.9, 0.98],
                            "sched": {"name": "CosineAnnealing", "warmup_steps": 500, "constant_steps": 50000,
                                      "min_lr": 2e-5}}


def test_clip_import_loads_in_nemo(tmp_path):
    from tiny_multimodal import make_tiny_clip

    hf = make_tiny_clip(str(tmp_path / "clip"))
    nemo = str(tmp_path / "clip.nemo")
    api.import_hf(hf, nemo)
    cfg = model_config(nemo)
    check_loadable(cfg)
    # a tower key would win over the top-level one in the tower's TransformerConfig
    assert "use_cpu_initialization" not in cfg["vision"] and "use_cpu_initialization" not in cfg["text"]
    assert cfg["text"]["fp8"] is False and cfg["vision"]["sequence_parallel"] is False


def test_neva_import_loads_in_nemo(tmp_path):
    from tiny_multimodal import make_tiny_llava

    hf = make_tiny_llava(str(tmp_path / "llava"))
    nemo = str(tmp_path / "neva.nemo")
    rep = api.import_hf(hf, nemo, options={"embed_vision_tower": True})
    cfg = model_config(nemo)
    check_loadable(cfg)
    assert "use_flash_attention" not in cfg  # True in neva_config.yaml; needs flash-attn
    assert cfg["data"]["conv_template"] == cfg["mm_cfg"]["llm"]["model_type"]
    assert cfg["data"]["image_token_len"] > 0  # the family's own data keys stay
    assert any("mm_cfg.vision_encoder.from_pretrained" in w for w in rep.warnings)


def _edited_import(llama_files: dict[str, str], tmp_path: Any, edit: Callable[[dict[str, Any]], None]) -> str:
    """An unpacked import of the untied Llama whose ``model_config.yaml`` ``edit`` changed
    (say, to what an older nemo-convert wrote)."""
    folder = str(tmp_path / "old")
    api.import_hf(llama_files["hf_False"], folder, packed=False)
    path = os.path.join(folder, "model_config.yaml")
    with open(path) as f:
        cfg = yaml.safe_load(f)
    edit(cfg)
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return folder


def test_reshard_adds_what_is_missing_and_keeps_what_is_there(llama_files, tmp_path):
    def older(cfg: dict[str, Any]) -> None:
        for key in ("optim", "nsys_profile", "use_cpu_initialization", "bias_activation_fusion"):
            del cfg[key]  # as an older nemo-convert wrote it
        del cfg["data"]["shuffle_documents"]
        cfg["seed"], cfg["data"]["num_workers"], cfg["fp8_hybrid"] = 42, 7, None

    folder = _edited_import(llama_files, tmp_path, older)
    out = str(tmp_path / "tp2.nemo")
    api.reshard(folder, out, tp=2, layout="legacy")
    got = model_config(out)
    check_loadable(got)
    assert got["seed"] == 42 and got["data"]["num_workers"] == 7 and got["fp8_hybrid"] is None
    assert got["data"]["shuffle_documents"] is True and got["bias_activation_fusion"] is False
    assert got["tensor_model_parallel_size"] == 2


def test_from_ckpt_output_loads_in_nemo(llama_files, tmp_path):
    pytest.importorskip("lightning")
    from ckpt_builders import lightning_save, nemo_tensors, training_config

    ref = llama_files["legacy_False"]
    src_cfg = training_config(model_config(ref))
    for key in ("nsys_profile", "use_cpu_initialization", "seed"):
        src_cfg.pop(key, None)
    src_cfg["optim"] = {"name": "distributed_fused_adam", "lr": 1.0e-4}  # no sched: stays so
    ckdir = tmp_path / "run" / "checkpoints"
    ckdir.mkdir(parents=True)
    shutil.copy(os.path.join(llama_files["hf_False"], "tokenizer.model"), ckdir / "tokenizer.model")
    state = {"model." + k: v for k, v in nemo_tensors(ref).items()}
    ckpt = lightning_save(state, src_cfg, str(ckdir / "last.ckpt"))
    out = str(tmp_path / "from_ckpt.nemo")
    api.from_ckpt(ckpt, out)
    got = model_config(out)
    assert got["optim"] == {"name": "distributed_fused_adam", "lr": 1.0e-4}
    assert got["data"]["data_prefix"] == ["1.0", "/data/train_text_document"] and got["data"]["seq_length"] == 64
    assert got["seed"] == 1234 and got["nsys_profile"]["enabled"] is False
    assert got["use_cpu_initialization"] is True
    with pytest.raises(AssertionError):
        check_loadable(got)  # optim.sched is the source's to have: never invented
    got["optim"]["sched"] = {"name": "CosineAnnealing"}
    check_loadable(got)


def test_complete_nemo_config_never_overwrites():
    cfg: dict[str, Any] = {"target": GPT_TARGET, "encoder_seq_length": 64, "seed": None,
                           "optim": {"name": "adam"}, "data": {"num_workers": 0}, "nemo_convert": {}}
    added = complete_nemo_config(cfg, DECLARED)
    assert cfg["seed"] is None and cfg["optim"] == {"name": "adam"} and cfg["data"]["num_workers"] == 0
    assert cfg["data"]["seq_length"] == 64 and "data.seq_length" in added and "optim" not in added
    assert complete_nemo_config(cfg, DECLARED) == []  # idempotent
    other = {"target": "some.other.Model", "x": 1}
    assert complete_nemo_config(other, DECLARED) == [] and other == {"target": "some.other.Model", "x": 1}
    mega = {"target": "a.b.MegatronT5Model"}
    assert "optim" in complete_nemo_config(mega, DECLARED)


def test_runtime_defaults_are_the_families_declarations():
    """CLIP's and NeVA's classes get their keys from their plugins' records, and only there:
    the core table knows NeMo's shared GPT class alone; two families declaring different
    defaults for one class are refused by name."""
    assert set(DECLARED) == {CLIP_TARGET, NEVA_TARGET}
    assert set(SHARED_DEFAULTS) == {GPT_TARGET}
    assert "vision" in defaults_for(CLIP_TARGET, DECLARED)({})
    assert defaults_for(CLIP_TARGET, {}) is not None and "vision" not in defaults_for(CLIP_TARGET, {})({})  # base only
    clip = get_registry().family("clip")
    other = dataclasses.replace(clip, name="clip_other", hf_architectures=("OtherCLIP",), hf_model_types=("clip_other",),
                                nemo=NemoTarget(CLIP_TARGET, runtime_defaults=lambda cfg: {}))

    class Plugin:
        @hookimpl
        def nemo_convert_model_families(self):
            return [other]

    with pytest.raises(PluginError, match="clip.*clip_other|clip_other.*clip"):
        registry_with(("other-clip", Plugin())).nemo_runtime_defaults()


# ------------------------------------------------------------------------------ HF tokenizers
def _tokenizer_json_only(folder: str, name_or_path: str | None = None) -> str:
    """A Llama whose tokenizer is tokenizer.json only (Llama-3 style)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from nemo_convert.examples import corpus

    make_tiny_llama(folder, tokenizer=False)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=150, special_tokens=["<unk>", "<s>", "</s>"],
                                                          show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)
    if name_or_path is not None:
        path = os.path.join(folder, "config.json")
        with open(path) as f:
            hf = json.load(f)
        hf["_name_or_path"] = name_or_path
        with open(path, "w") as f:
            json.dump(hf, f)
    return folder


def test_hf_tokenizer_section_and_warning(tmp_path):
    src = _tokenizer_json_only(str(tmp_path / "llama3"))
    nemo = str(tmp_path / "l3.nemo")
    rep = api.import_hf(src, nemo)
    cfg = model_config(nemo)
    check_loadable(cfg)
    tok = cfg["tokenizer"]
    # what NeMo's _build_tokenizer (mbm L453-463) hands to AutoTokenizer (auto_tokenizer.py L179-184)
    assert tok["library"] == "huggingface" and tok["type"] == os.path.abspath(src)
    assert tok["model"] is None and tok["vocab_file"] is None and tok["merge_file"] is None
    assert tok["use_fast"] is True
    files = cfg["nemo_convert"]["tokenizer_files"]
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(files)
    with tarfile.open(nemo) as t:
        names = {n.lstrip("./") for n in t.getnames()}
    assert all(ref[len("nemo:"):] in names for ref in files.values())
    assert sum("builds a Hugging Face tokenizer from tokenizer.type" in w for w in rep.warnings) == 1
    # NeMo's AutoTokenizer: AUTOTOKENIZER.from_pretrained(pretrained_model_name_or_path=type, use_fast=...)
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(tok["type"], use_fast=tok["use_fast"])
    assert loaded.eos_token == "</s>"


def test_hf_tokenizer_type_is_the_hub_id_when_recorded(tmp_path):
    src = _tokenizer_json_only(str(tmp_path / "l3hub"), "meta-llama/Llama-3.2-1B")
    nemo = str(tmp_path / "l3hub.nemo")
    api.import_hf(src, nemo)
    assert model_config(nemo)["tokenizer"]["type"] == "meta-llama/Llama-3.2-1B"


def test_no_tokenizer_is_noted(tmp_path):
    src = make_tiny_llama(str(tmp_path / "notok"), tokenizer=False)
    rep = api.import_hf(src, str(tmp_path / "notok.nemo"))
    assert any("has no tokenizer section" in n for n in rep.notes) and not rep.warnings



@pytest.mark.parametrize("kind", ["struct", "omegaconf"])
def test_emulation_reproduces_the_reported_failure(llama_files, kind):
    """Without ``optim`` the emulation fails as NeMo 2.4.1 did on our files before:
    ``ConfigAttributeError: Key 'optim' is not in struct`` (megatron_base_model.py L151)."""
    cfg = model_config(llama_files["dist_False"])
    del cfg["optim"]
    with pytest.raises(AttributeError, match="optim"):
        emulate_megatron_gpt(as_struct(cfg, kind))


def test_add_tokens_output_gains_what_is_missing(llama_files, tmp_path):
    def older(cfg: dict[str, Any]) -> None:
        del cfg["optim"], cfg["data"]

    folder = _edited_import(llama_files, tmp_path, older)
    out = str(tmp_path / "tok.nemo")
    api.add_tokens(folder, out, ["<extra_id_0>"])
    check_loadable(model_config(out))


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("extra", [0, 64])
def test_override_vocab_size_where_the_tokenizer_is_not_the_vocabulary(tmp_path, tp, extra):
    """NeMo sizes the embedding as ``cfg.get('override_vocab_size', padded_vocab_size)``
    (gpt L501), the padded size being the tokenizer's ``vocab_size`` (its piece count)
    padded to make_vocab_size_divisible_by × TP (mbm L623-645): the rows we store either way."""
    import sentencepiece as spm
    from tiny_models import write_sentencepiece

    from nemo_convert.convert.nemo_write import Parallelism

    hf = str(tmp_path / "hf")
    os.makedirs(hf)
    tok = write_sentencepiece(os.path.join(hf, "tokenizer.model"), vocab_size=200)
    pieces = spm.SentencePieceProcessor(model_file=tok).get_piece_size()
    make_tiny_llama(hf, tokenizer=False, vocab_size=pieces + extra)
    nemo = str(tmp_path / "m.nemo")
    api.import_hf(hf, nemo, layout="legacy", parallel=Parallelism(tp, 1))
    cfg = model_config(nemo)
    rows = cfg["nemo_convert"]["padded_vocab_size"]
    multiple = cfg["make_vocab_size_divisible_by"] * tp
    assert cfg.get("override_vocab_size", -(-pieces // multiple) * multiple) == rows
    assert ("override_vocab_size" in cfg) == (extra != 0)
    if extra and tp == 2:
        assert rows > pieces + extra  # padded at TP 2: the override is the rows, not vocab_size
    check_loadable(cfg)


def test_add_tokens_sets_override_vocab_size(tmp_path):
    """A tokenizer grown past the embedding: NeMo must keep the stored rows, as the
    embedding is not resized."""
    import sentencepiece as spm
    from tiny_models import write_sentencepiece

    hf = str(tmp_path / "hf")
    os.makedirs(hf)
    tok = write_sentencepiece(os.path.join(hf, "tokenizer.model"), vocab_size=200)
    pieces = spm.SentencePieceProcessor(model_file=tok).get_piece_size()
    make_tiny_llama(hf, tokenizer=False, vocab_size=pieces)
    api.import_hf(hf, str(tmp_path / "m.nemo"))
    assert "override_vocab_size" not in model_config(str(tmp_path / "m.nemo"))
    rep = api.add_tokens(str(tmp_path / "m.nemo"), str(tmp_path / "tok.nemo"), ["<extra_id_0>", "<extra_id_1>"])
    cfg = model_config(str(tmp_path / "tok.nemo"))
    assert rep.new_vocab_size == pieces + 2
    assert cfg["override_vocab_size"] == cfg["nemo_convert"]["padded_vocab_size"] == pieces
    check_loadable(cfg)


def test_the_vision_tower_warning_is_the_llava_familys():
    """The core names no family's config keys: the warning about a vision tower NeMo fetches
    by hub id comes from the LLaVA plugin's record (``NemoTarget.restore_warnings``)."""
    from nemo_convert.convert.nemo_defaults import restore_warnings

    cfg = {"target": NEVA_TARGET, "mm_cfg": {"vision_encoder": {"from_hf": True, "from_pretrained": "org/tower"}}}
    assert restore_warnings(cfg, DECLARED) == []
    llava = get_registry().family("llava").nemo
    lines = restore_warnings(cfg, DECLARED, llava.restore_warnings)
    assert len(lines) == 1 and "org/tower" in lines[0]
    cfg["mm_cfg"]["vision_encoder"]["from_hf"] = False  # an embedded tower is not fetched
    assert restore_warnings(cfg, DECLARED, llava.restore_warnings) == []
