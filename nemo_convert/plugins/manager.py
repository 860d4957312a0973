"""Discovers plugins through entry points and answers "which plugin handles this?".

* Every plugin — ours in ``plugins/`` and third parties' — is found through the
  ``nemo_convert`` entry-point group.
* A plugin that fails to import is skipped with a warning naming it.
* ``NEMO_CONVERT_DISABLE_PLUGINS=a,b`` blocks plugins by entry-point name.
* Two records with one name are an error naming both distributions.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, cast

import pluggy

from nemo_convert.errors import NemoConvertError, PluginError, UnsupportedError
from nemo_convert.formats.megatron.providers import ProviderTable
from nemo_convert.formats.nemo.nemo_targets import canonical_target
from nemo_convert.plugins import hookspecs
from nemo_convert.formats.io.replace import KIND_NAMES
from nemo_convert.plugins.records import (CommandOption, ModelFamily, OutputTarget, ShardingStrategy, TokenizerPatcher,
                                         Verifier)
from nemo_convert.sharding.protocol import ExpertSharding, PipelineSharding, Strategies, TensorSharding, protocol_problem
from nemo_convert.spec import provenance_of

ENTRY_POINT_GROUP = "nemo_convert"
DISABLE_ENV = "NEMO_CONVERT_DISABLE_PLUGINS"


@dataclass(frozen=True)
class Provided:
    """A record together with the plugin and distribution that provided it."""

    record: Any
    plugin: str
    distribution: str


class PluginLoadWarning(UserWarning):
    """A plugin could not be imported and was skipped."""


class Registry:
    """All records that the registered plugins provide."""

    def __init__(self, pm: pluggy.PluginManager, distributions: dict[str, str]) -> None:
        self._pm = pm
        self._dists = distributions
        self.families = self._collect("nemo_convert_model_families", ModelFamily)
        self._check_hf_names()
        self.tokenizer_patchers = self._collect("nemo_convert_tokenizer_patchers", TokenizerPatcher)
        self.sharding_strategies = self._collect("nemo_convert_sharding_strategies", ShardingStrategy)
        self.verifiers = self._collect("nemo_convert_verifiers", Verifier)
        self.output_targets = self._collect("nemo_convert_targets", OutputTarget)

    def _collect(self, hook_name: str, kind: type[Any]) -> dict[str, Provided]:
        out: dict[str, Provided] = {}
        hook = getattr(self._pm.hook, hook_name)
        for impl in hook.get_hookimpls():
            plugin_name = self._pm.get_name(impl.plugin) or "?"
            dist = self._dists.get(plugin_name, "(not installed: registered at run time)")
            records = impl.function() or []
            for rec in records:
                if not isinstance(rec, kind):
                    raise PluginError(f"plugin {plugin_name!r} ({dist}) returned {type(rec).__name__} "
                                      f"from {hook_name}, expected {kind.__name__}")
                if isinstance(rec, ShardingStrategy):
                    problem = protocol_problem(rec.axis, rec.implementation)
                    if problem is not None:
                        raise PluginError(f"sharding strategy {rec.name!r} of plugin {plugin_name!r} ({dist}) is "
                                          f"refused: {problem}; see nemo_convert/sharding/protocol.py")
                if isinstance(rec, OutputTarget) and rec.kind not in KIND_NAMES:
                    raise PluginError(f"output target {rec.name!r} of plugin {plugin_name!r} ({dist}) names output "
                                      f"kind {rec.kind!r}; use one of {', '.join(sorted(KIND_NAMES))} (what "
                                      "--overwrite may replace: nemo_convert/formats/io/replace.py)")
                if rec.name in out:
                    other = out[rec.name]
                    raise PluginError(
                        f"{kind.__name__} {rec.name!r} is provided twice: by plugin {other.plugin!r} "
                        f"of distribution {other.distribution!r} and by plugin {plugin_name!r} "
                        f"of distribution {dist!r}; uninstall one or block it with {DISABLE_ENV}")
                out[rec.name] = Provided(rec, plugin_name, dist)
        return out

    def _check_hf_names(self) -> None:
        """Two families listing one HF architecture or model type is an error naming both
        (as two records of one name are): which family reads a ``config.json`` is never a
        matter of registration order."""
        seen: dict[tuple[str, str], Provided] = {}
        for p in self.families.values():
            for kind, values in (("architecture", p.record.hf_architectures), ("model_type", p.record.hf_model_types)):
                for value in values:
                    other = seen.setdefault((kind, value), p)
                    if other is not p:
                        raise PluginError(
                            f"HF {kind} {value!r} is listed by two families: {other.record.name!r} of plugin "
                            f"{other.plugin!r} (distribution {other.distribution!r}) and {p.record.name!r} of plugin "
                            f"{p.plugin!r} (distribution {p.distribution!r}); uninstall one or block it with "
                            f"{DISABLE_ENV}")

    # -- families ---------------------------------------------------------------------
    def family(self, name: str) -> ModelFamily:
        """The family named ``name``; :class:`PluginError` listing the known ones otherwise."""
        try:
            return self.families[name].record
        except KeyError:
            known = ", ".join(sorted(self.families)) or "none"
            raise PluginError(f"no model family named {name!r} (installed: {known})") from None

    def family_for_hf_config(self, config: dict[str, Any]) -> ModelFamily:
        """The family handling an HF ``config.json`` (by ``architectures``, then ``model_type``;
        each is listed by one family at most: :meth:`_check_hf_names`)."""
        archs = config.get("architectures") or []
        for arch in archs:
            for p in self.families.values():
                if arch in p.record.hf_architectures:
                    return p.record
        mtype = config.get("model_type")
        for p in self.families.values():
            if mtype in p.record.hf_model_types:
                return p.record
        known = ", ".join(sorted(a for p in self.families.values() for a in p.record.hf_architectures))
        raise PluginError(f"no installed model family handles architectures={archs} model_type={mtype!r} "
                          f"(handled: {known or 'none'}); install a plugin or pass --family")

    def family_for_nemo_config(self, config: dict[str, Any]) -> ModelFamily:
        """The family of a NeMo ``model_config.yaml``: our own record of it; else, among the
        families of its ``target`` (or of its NeMo 2 class), the one that claims it.

        A family claims a NeMo-native config only when its own table represents it exactly
        (``refuses_nemo_config`` says nothing) and its ``claims_nemo_config`` — a predicate on
        its own features — holds; a family without a predicate is its target's default,
        taken when none claims (Llama for ``MegatronGPTModel``). Two claims are an error
        asking for ``--family``, naming both; a NeMo 2 class listed by one family that
        represents the config is that family's."""
        ours = provenance_of(config).family
        if ours:
            return self.family(ours)
        target = canonical_target(config.get("target"))  # NeMo SFT / NeMo-Aligner classes: MegatronGPTModel
        same = [p.record for p in self.families.values() if target and target == p.record.nemo.target]
        if same:
            return _choose(same, config, f"NeMo target {target!r}", named=False)
        target2 = config.get("nemo2_target")
        listing = [p.record for p in self.families.values() if target2 and target2 in p.record.nemo.nemo2_targets]
        if listing:
            return _choose(listing, config, f"NeMo 2 class {target2!r}", named=True)
        raise PluginError(f"no installed model family handles NeMo target "
                          f"{config.get('target') or config.get('nemo2_target')!r}; "
                          "pass --family")

    def command_options(self) -> list[CommandOption]:
        """The command-line options plugins declare (families' ``cli_options``, verifiers'
        ``options``), each once; one flag declared differently twice is an error naming both."""
        seen: dict[tuple[str, str], tuple[CommandOption, str]] = {}
        declared = [(o, p.plugin) for p in self.families.values() for o in p.record.options.cli]
        declared += [(o, p.plugin) for p in self.verifiers.values() for o in p.record.options]
        for opt, plugin in declared:
            other = seen.get((opt.command, opt.flag))
            if other is not None and other[0] != opt:
                raise PluginError(f"option {opt.flag} of {opt.command!r} is declared differently by plugins "
                                  f"{other[1]!r} and {plugin!r}")
            seen.setdefault((opt.command, opt.flag), (opt, plugin))
        return [o for o, _ in seen.values()]

    # -- output targets -----------------------------------------------------------------
    def target(self, name: str) -> OutputTarget:
        """The output target named ``name`` (``--to``); :class:`UnsupportedError` listing the
        installed ones otherwise."""
        try:
            return self.output_targets[name].record
        except KeyError:
            names = list(self.output_targets)
            known = (", ".join(names[:-1]) + " or " + names[-1]) if len(names) > 1 else (names or ["none installed"])[0]
            raise UnsupportedError(f"unknown target {name!r} (use {known})") from None

    def targets(self) -> list[OutputTarget]:
        """Every installed output target, in registration order (the built-in ones first)."""
        return [p.record for p in self.output_targets.values()]

    def sharding(self, axis: str) -> ShardingStrategy:
        """The one strategy for ``axis`` (``"tp"``, ``"pp"``, ``"ep"``); two claiming it is an
        error naming both (a replacement is installed by blocking the built-in ``sharding``)."""
        found = [p for p in self.sharding_strategies.values() if p.record.axis == axis]
        if len(found) > 1:
            names = " and ".join(f"{p.record.name!r} of {p.distribution!r}" for p in found)
            raise PluginError(f"sharding strategies {names} both handle axis {axis!r}; block one with "
                              f"{DISABLE_ENV}")
        if not found:
            raise PluginError(f"no sharding strategy for axis {axis!r} is installed")
        return found[0].record

    def nemo_runtime_defaults(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        """NeMo class → the runtime keys it needs, as the families declare them
        (``NemoTarget.runtime_defaults``); two families declaring different ones for one
        class is an error naming both."""
        out: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
        by: dict[str, str] = {}
        for name, p in self.families.items():
            target, make = p.record.nemo.target, p.record.nemo.runtime_defaults
            if make is None:
                continue
            if target in out and out[target] is not make:
                raise PluginError(f"families {by[target]!r} and {name!r} declare different runtime defaults for "
                                  f"NeMo class {target}")
            out[target], by[target] = make, name
        return out

    def providers(self) -> ProviderTable:
        """The Megatron-Bridge providers the families declare (``ModelFamily.megatron_bridge``):
        what ``--to megatron-bridge`` writes and which provider classes a directory is read by;
        and the NeMo 2 config classes they declare (``NemoTarget.nemo2_configs``) under each of
        their NeMo 2 model classes; two families declaring one config class differently is an
        error naming both."""
        nemo2: dict[str, dict[str, Any]] = {}
        first: dict[str, tuple[str, Any]] = {}
        for name, p in self.families.items():
            for cls, declared in p.record.nemo.nemo2_configs.items():
                other = first.setdefault(cls, (name, declared))
                if other[1] != declared:
                    raise PluginError(f"families {other[0]!r} and {name!r} declare NeMo 2 config class {cls} "
                                      "differently")
            for model in p.record.nemo.nemo2_targets:
                nemo2.setdefault(model, {}).update(p.record.nemo.nemo2_configs)
        return ProviderTable({name: p.record.megatron_bridge for name, p in self.families.items()
                              if p.record.megatron_bridge is not None}, nemo2)

    def strategies(self) -> Strategies:
        """The strategies every reader and writer of a sharded layout uses: the one of
        each axis (tensor and pipeline parallelism must be installed; without an
        expert-parallel strategy only EP = 1 is written). Their implementations were
        checked against their axis's protocol when the registry was built."""
        tensor = cast(TensorSharding, self.sharding("tp").implementation)
        pipeline = cast(PipelineSharding, self.sharding("pp").implementation)
        has_ep = any(p.record.axis == "ep" for p in self.sharding_strategies.values())
        expert = cast(ExpertSharding, self.sharding("ep").implementation) if has_ep else None
        return Strategies(tensor, pipeline, expert)


def _refusal(family: ModelFamily, config: dict[str, Any]) -> str | None:
    """Why ``family`` does not compute a NeMo config (None: it does, or it has no check)."""
    if family.refuses_nemo_config is None:
        return None
    try:
        return family.refuses_nemo_config(config)
    except (NemoConvertError, KeyError, TypeError, ValueError) as exc:
        return f"the config does not describe one ({type(exc).__name__}: {exc})"


def _choose(families: list[ModelFamily], config: dict[str, Any], what: str, *, named: bool) -> ModelFamily:
    """The family among ``families`` (those of one NeMo class) that claims ``config``
    (:meth:`Registry.family_for_nemo_config`); ``named``: the class names its family, so the
    only one that represents the config is it."""
    refused = {f.name: _refusal(f, config) for f in families}
    fits = [f for f in families if refused[f.name] is None]
    if named and len(fits) == 1:
        return fits[0]
    claimed = [f for f in fits if f.claims_nemo_config is not None and f.claims_nemo_config(config)]
    if len(claimed) > 1:
        raise PluginError(f"{what}: the config fits families {', '.join(f.name for f in claimed)}; "
                          f"pass --family {claimed[0].name} (or another of them)")
    if claimed:
        return claimed[0]
    default = [f for f in fits if f.claims_nemo_config is None]
    if len(default) > 1:
        raise PluginError(f"{what}: families {', '.join(f.name for f in default)} are each its default and all fit "
                          f"the config; pass --family {default[0].name} (or another of them)")
    if default:
        return default[0]
    why = "; ".join(f"{f.name}: {refused[f.name]}" if refused[f.name] is not None
                    else f"{f.name}: fits, but is never guessed (pass --family {f.name})" for f in families)
    raise UnsupportedError(f"no installed model family computes this NeMo config of {what} exactly ({why})")


def _disabled() -> set[str]:
    return {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}


def build_plugin_manager(extra_plugins: Iterable[tuple[str, object]] = (),
                         *, entry_points: bool = True) -> tuple[pluggy.PluginManager, dict[str, str]]:
    """A pluggy manager with every entry-point plugin (and ``extra_plugins``) registered."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    disabled = _disabled()
    for name in disabled:
        pm.set_blocked(name)
    dists: dict[str, str] = {}
    names: dict[int, str] = {}  # a distribution's name parses its METADATA: once per distribution
    if entry_points:
        for ep in md.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in disabled or pm.is_registered(ep.name) or pm.has_plugin(ep.name):
                continue
            if ep.dist is None:
                dist = "?"
            else:
                dist = names.get(id(ep.dist)) or names.setdefault(id(ep.dist), ep.dist.name)
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must not break the tool
                warnings.warn(f"nemo-convert plugin {ep.name!r} from {dist!r} failed to load and was "
                              f"skipped: {type(exc).__name__}: {exc}", PluginLoadWarning, stacklevel=2)
                continue
            if pm.is_registered(plugin):  # a second entry point naming the same module
                other = pm.get_name(plugin)
                raise PluginError(f"plugin module {getattr(plugin, '__name__', plugin)!r} is registered twice: as "
                                  f"{other!r} of distribution {dists.get(other or '', '?')!r} and as {ep.name!r} "
                                  f"of distribution {dist!r}; uninstall one or block it with {DISABLE_ENV}")
            pm.register(plugin, name=ep.name)
            dists[ep.name] = dist
    for name, plugin in extra_plugins:
        if name in disabled:
            continue
        pm.register(plugin, name=name)
    return pm, dists


_REGISTRY: Registry | None = None
#: A registry built moments ago (by the CLI, to read its plugins' options) with the warnings
#: its build raised, for :func:`get_registry` to adopt instead of building another.
_OFFERED: tuple[Registry, list[warnings.WarningMessage]] | None = None


def offer_registry(registry: Registry | None, caught: Iterable[warnings.WarningMessage] = ()) -> None:
    """Offer ``registry`` (built from the installed entry points, its build's warnings
    ``caught``) to the next :func:`get_registry`, which adopts it — re-issuing those warnings
    where its own build would have issued them — instead of loading every plugin again;
    ``None`` withdraws the offer. The CLI offers the registry it read the plugins' command
    options from, and withdraws it when the command ends."""
    global _OFFERED
    _OFFERED = (registry, list(caught)) if registry is not None else None


def get_registry(*, refresh: bool = False) -> Registry:
    """The process-wide registry, built on first use from the installed entry points (or
    adopted from :func:`offer_registry`)."""
    global _REGISTRY, _OFFERED
    if _REGISTRY is None or refresh:
        offered, _OFFERED = _OFFERED, None
        if offered is not None and not refresh:
            _REGISTRY, caught = offered
            for w in caught:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        else:
            pm, dists = build_plugin_manager()
            _REGISTRY = Registry(pm, dists)
    return _REGISTRY


def registry_with(*plugins: tuple[str, object], entry_points: bool = True) -> Registry:
    """A fresh registry with extra in-process plugins (tests, notebooks)."""
    pm, dists = build_plugin_manager(plugins, entry_points=entry_points)
    return Registry(pm, dists)
