"""Key mappings as data (rules with inverses, each planning itself) and the planner that checks them."""

from nemo_convert.mapping.rules import (Custom, FuseGated, FuseQKV, Mapping, Offset, PackedQKV, Parallel, PlanContext,
                                        Rename, Reshape, Rule, Sections, Shared, SpecField, StackedExperts, Task,
                                        Tied, cfg_get)

__all__ = ["Custom", "FuseGated", "FuseQKV", "Mapping", "Offset", "PackedQKV", "Parallel", "PlanContext", "Rename",
           "Reshape", "Rule", "Sections", "Shared", "SpecField", "StackedExperts", "Task", "Tied", "cfg_get"]
