"""Key mappings as data (rules with inverses) and the planner that checks them."""

from nemo_convert.mapping.rules import (Custom, FuseGated, FuseQKV, Mapping, Offset, PackedQKV, Parallel, Rename,
                                        Reshape, Tied, cfg_get)

__all__ = ["Custom", "FuseGated", "FuseQKV", "Mapping", "Offset", "PackedQKV", "Parallel", "Rename", "Reshape", "Tied",
           "cfg_get"]
