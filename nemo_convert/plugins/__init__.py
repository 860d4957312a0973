"""The plugin system: pluggy hook specifications, typed records, and the manager."""

from nemo_convert.plugins.records import ModelFamily, ShardingStrategy, TokenizerPatcher

__all__ = ["ModelFamily", "ShardingStrategy", "TokenizerPatcher"]
