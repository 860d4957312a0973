"""Public bases for model families: the config table and the GPT decoder.

Plugins build on these (``from nemo_convert.families import gpt_family, GPT_CONFIG``);
see ``docs/plugins.md``.
"""

from nemo_convert.families.config_table import (HARMLESS_KEYS, REQUIRED, Check, ConfigTable, Derived, Field,
                                                refuse_unknown_keys, set_path)
from nemo_convert.families.gpt import (NEMO_GPT_TARGET, GPTFeatures, MoEBlock, attention_rules, dense_mlp_rules,
                                       gpt_family, gpt_mapping, mla_attention_rules, moe_mlp_rules, mtp_rules, never,
                                       norm_rules, table_translation)
from nemo_convert.families.gpt_config import (DTYPE, EXPERTS_FFN, GPT_CONFIG, GPT_NEMO_CONSTANTS, HF_MTP, MOE_HARMLESS,
                                              MOE_NEMO_CONSTANTS, MOE_ROWS, MTP_LAYERS, NORM_TOPK_PROB, activation, linear_biases,
                                              moe_layers, no_per_layer_windows, num_experts, rope, sliding_window)

__all__ = ["DTYPE", "EXPERTS_FFN", "GPT_CONFIG", "GPT_NEMO_CONSTANTS", "HARMLESS_KEYS", "HF_MTP", "MOE_HARMLESS",
           "MOE_NEMO_CONSTANTS", "MOE_ROWS", "MTP_LAYERS", "NEMO_GPT_TARGET", "NORM_TOPK_PROB", "REQUIRED", "Check", "ConfigTable",
           "Derived", "Field", "GPTFeatures", "MoEBlock", "activation", "attention_rules", "dense_mlp_rules",
           "gpt_family", "gpt_mapping", "linear_biases", "mla_attention_rules", "moe_layers", "moe_mlp_rules", "mtp_rules", "never",
           "no_per_layer_windows", "norm_rules", "num_experts", "refuse_unknown_keys", "rope", "set_path",
           "sliding_window", "table_translation"]
