"""The GPT decoder's family record: :func:`gpt_family` assembles a family plugin's
declaration (its config table, features, options) on the GPT base's mapping
(:mod:`nemo_convert.families.gpt`), with the config translation both ways, the source
options (expert layout, MTP layers, ``--drop-mtp``) and the refusals.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from nemo_convert.errors import ConfigError, UnsupportedError
from nemo_convert.families.architecture import nemo_refusal
from nemo_convert.families.config_table import ConfigTable, set_path
from nemo_convert.families.gpt import (HF_EXPERT_LAYOUTS, HF_EXPERTS, NEMO_GPT_TARGET, GPTFeatures, gpt_mapping,
                                       hf_experts_layout)
from nemo_convert.families.moe_config import HF_MTP, HF_MTP_COPIES, MTP_LAYERS
from nemo_convert.mapping.rules import Mapping
from nemo_convert.plugins.records import CommandOption, FamilyOptions, HFSide, ModelFamily, NemoTarget


def table_translation(table: ConfigTable, family: str) -> tuple[Callable[..., dict[str, Any]],
                                                                  Callable[[dict[str, Any]], dict[str, Any]]]:
    """``config_to_nemo`` / ``config_to_hf`` functions derived from one table."""

    def config_to_nemo(hf: dict[str, Any]) -> dict[str, Any]:
        return table.to_nemo(hf, family)

    def config_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
        return table.to_hf(cfg)

    return config_to_nemo, config_to_hf


def _with_expert_layout(to_nemo: Callable[..., dict[str, Any]], family: str) -> Callable[..., dict[str, Any]]:
    """``config_to_nemo`` that records the ``hf_experts`` layout (import option, read from
    the tensor names by :func:`hf_experts_layout` unless given)."""

    def config_to_nemo(hf: dict[str, Any], hf_experts: str = "per_expert", **more: Any) -> dict[str, Any]:
        if hf_experts not in HF_EXPERT_LAYOUTS:
            raise ConfigError(f"hf_experts={hf_experts!r} is not an expert layout of family {family} "
                              f"(use {' or '.join(HF_EXPERT_LAYOUTS)})")
        cfg = to_nemo(hf, **more)
        if hf_experts == "fused":
            set_path(cfg, HF_EXPERTS, hf_experts)
        return cfg

    return config_to_nemo


def checked_to_hf(to_hf: Callable[[dict[str, Any]], dict[str, Any]], refuse: Callable[[dict[str, Any]], str | None],
                  family: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """``config_to_hf`` that first refuses, by name, a NeMo config whose math the family's
    HF class does not compute (:func:`~nemo_convert.families.architecture.nemo_refusal`)."""

    def config_to_hf(cfg: dict[str, Any]) -> dict[str, Any]:
        reason = refuse(cfg)
        if reason is not None:
            raise UnsupportedError(f"{reason} (family {family} cannot export it exactly; --family chooses another)")
        return to_hf(cfg)

    return config_to_hf


#: ``--drop-mtp``: an import switch of every family with MTP layers.
DROP_MTP = CommandOption("import", "--drop-mtp", "leave the source's multi-token-prediction layers "
                         "(num_nextn_predict_layers, e.g. DeepSeek-V3's) out, with one note; without it they are "
                         "imported into Megatron-Core's MTP block. Same as --option drop_mtp=true")


def hf_mtp_weights(hf: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The ``hf_mtp_weights`` import option read from the source: whether it stores the MTP
    layers its config announces (transformers announces one and never saves it)."""
    count, layers = int(hf.get("num_nextn_predict_layers") or 0), int(hf.get("num_hidden_layers") or 0)
    if not count:
        return {}
    prefixes = tuple(f"model.layers.{layers + k}." for k in range(count))
    stored = any(k.startswith(prefixes) for k in keys)
    # GLM-4.6's files store the MTP layer without the copies of the embedding and the head
    # that DeepSeek-V3's and GLM-4.5's hold (mtp_rules)
    copies = stored and f"model.layers.{layers}.embed_tokens.weight" in set(keys)
    return {"hf_mtp_weights": stored, "hf_mtp_copies": copies or not stored}


def _flag(value: Any) -> bool:
    """A switch given as a bool or as ``--option KEY=VALUE`` text."""
    return str(value).strip().lower() not in ("false", "0", "no", "none", "")


def _with_mtp(to_nemo: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """``config_to_nemo`` that leaves the MTP layers out when asked (``drop_mtp``) or when
    the source does not store them (``hf_mtp_weights=False``), recording which under
    ``nemo_convert.hf_mtp`` (``{"dropped": k}`` / ``{"absent": k}``) for the mapping and
    for export's ``num_nextn_predict_layers``."""

    def config_to_nemo(hf: dict[str, Any], drop_mtp: Any = False, hf_mtp_weights: Any = True,
                       hf_mtp_copies: Any = True, **more: Any) -> dict[str, Any]:
        cfg = to_nemo(hf, **more)
        count = int(cfg.get("mtp_num_layers") or 0)
        stored, drop = _flag(hf_mtp_weights), _flag(drop_mtp)
        if count and (drop or not stored):
            cfg["mtp_num_layers"] = None
            set_path(cfg, HF_MTP, {"dropped" if stored else "absent": count})
        elif count and not _flag(hf_mtp_copies):
            set_path(cfg, HF_MTP_COPIES, False)
        return cfg

    return config_to_nemo


def _source_options(*readers: Callable[[dict[str, Any], Sequence[str]], dict[str, Any]]) -> Callable[
        [dict[str, Any], Sequence[str]], dict[str, Any]]:
    def read(hf: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for r in readers:
            out.update(r(hf, keys))
        return out

    return read


def gpt_family(name: str, *, architecture: str, model_type: str, config: ConfigTable,
               features: GPTFeatures = GPTFeatures(), nemo2_targets: tuple[str, ...] = (),
               nemo2_configs: dict[str, dict[str, Any] | str] | None = None, description: str = "", claims: Callable[[dict[str, Any]], bool] | None = None,
               mapping: Callable[[dict[str, Any]], Mapping] | None = None, **extra: Any) -> ModelFamily:
    """A dense decoder family: the GPT block with ``features``, translated by ``config``
    (``GPT_CONFIG.extend(...)``). ``claims`` recognises a NeMo-written ``MegatronGPTModel``
    config as this family's (``None``: the default family, Llama). The NeMo side is
    ``MegatronGPTModel`` in the ``dist`` layout (plus ``nemo2_targets``, whose config classes
    ``nemo2_configs`` declares: :class:`NemoTarget`); the HF side's
    transformers class is ``architecture``. An MoE block adds the ``hf_experts``
    import option, read from the tensor names. Export refuses a NeMo config whose math
    ``architecture`` does not compute, by name (``refuses_nemo_config``; it also keeps the
    family out of the choice for a NeMo-native config). ``mapping`` replaces the GPT
    block's (a decoder whose HF names are its own, GPT-2). ``extra`` sets other
    :class:`ModelFamily` fields: ``trtllm=gpt_trtllm(ARCHITECTURE, FIELDS)`` (the TensorRT-LLM
    target of ``quantize``, :mod:`nemo_convert.families.trtllm`; without it the family is
    refused by name), ``hf=HFSide(...)``."""
    table = (config.extend(MTP_LAYERS) if features.mtp else config).extend(
        hf_constants={"architectures": [architecture], "model_type": model_type})
    to_nemo, to_hf = table_translation(table, name)
    refuse = nemo_refusal(table, name, architecture, zero_centred_either=features.zero_centred_norms)
    keys: tuple[str, ...] = ()
    readers: list[Callable[[dict[str, Any], Sequence[str]], dict[str, Any]]] = []
    cli: tuple[CommandOption, ...] = ()
    if features.mtp:
        to_nemo = _with_mtp(to_nemo)
        keys, cli = keys + ("drop_mtp", "hf_mtp_weights", "hf_mtp_copies"), (DROP_MTP,)
        readers.append(hf_mtp_weights)
    if features.moe is not None:
        to_nemo = _with_expert_layout(to_nemo, name)
        keys = ("hf_experts",) + keys
        readers.insert(0, hf_experts_layout)
    options = FamilyOptions(keys=keys, cli=cli, from_source=_source_options(*readers) if readers else None)
    fields: dict[str, Any] = {
        "nemo": NemoTarget(NEMO_GPT_TARGET, nemo2_targets=nemo2_targets, nemo2_configs=dict(nemo2_configs or {}),
                           default_layout="dist"),
        "hf": HFSide(model_class=architecture), "options": options, **extra}
    return ModelFamily(
        name=name, hf_architectures=(architecture,), hf_model_types=(model_type,),
        mapping=mapping or gpt_mapping(features), config_to_nemo=to_nemo, config_to_hf=checked_to_hf(to_hf, refuse, name),
        description=description, claims_nemo_config=claims, refuses_nemo_config=refuse, **fields)


def never(cfg: dict[str, Any]) -> bool:
    """``claims=never``: a family NeMo 1 never wrote (only ``--family`` or our record selects it)."""
    return False

