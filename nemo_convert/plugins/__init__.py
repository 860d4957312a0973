"""The plugin system: pluggy hook specifications, typed records, and the manager."""

from nemo_convert.plugins.records import FamilyOptions, HFSide, ModelFamily, NemoTarget, ShardingStrategy, TokenizerPatcher

__all__ = ["FamilyOptions", "HFSide", "ModelFamily", "NemoTarget", "ShardingStrategy", "TokenizerPatcher"]
