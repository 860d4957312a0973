"""Public bases for model families: the config table and the GPT decoder.

Plugins build on these (``from nemo_convert.families import gpt_family, GPT_CONFIG``);
see ``docs/plugins.md``.
"""

from nemo_convert.families.architecture import linear_bias_pattern, mlp_activation, nemo_refusal, signature
from nemo_convert.families.config_table import (HARMLESS_KEYS, REQUIRED, Check, ConfigTable, Derived, Field, NemoCheck,
                                                refuse_unknown_keys, set_path)
from nemo_convert.formats.megatron.provider_gpt_oss import QUICK_GELU
from nemo_convert.formats.megatron.providers import (AUTOCAST_BF16, DENSE, DENSE_CLASS_DEFAULTS, FAST_GELU, GPT_PROVIDER,
                                                      HYBRID_PROVIDER, MLA_PROVIDER, NO_LINEAR_BIAS, SILU, SQUARED_RELU, ProviderFamily)
from nemo_convert.families.gpt import (NEMO_GPT_TARGET, GPTFeatures, MoEBlock, attention_rules, dense_mlp_rules,
                                       gpt_mapping, mla_attention_rules, moe_mlp_rules, mtp_rules, norm_rules)
from nemo_convert.families.gpt_family import gpt_family, never, table_translation
from nemo_convert.families.gpt_config import (DTYPE, GELU_ERF, GELU_TANH, GPT_CONFIG, GPT_NEMO_CONSTANTS, activation,
                                              activation_choice, layer_windows, linear_biases, no_per_layer_windows,
                                              partial_rope, query_pre_attn_scalar, rope, sliding_window, softcap)
from nemo_convert.families.moe_config import (EXPERTS_FFN, HF_MTP, HF_MTP_COPIES, MOE_HARMLESS, MOE_NEMO_CONSTANTS,
                                              MOE_ROWS, MTP_LAYERS, NORM_TOPK_PROB, dense_first_experts, moe_layers,
                                              num_experts, top_two_groups)
from nemo_convert.families.mla_config import MLA_ROWS

__all__ = ["AUTOCAST_BF16", "DENSE", "DENSE_CLASS_DEFAULTS", "FAST_GELU", "GPT_PROVIDER", "HYBRID_PROVIDER",
           "MLA_PROVIDER",
           "NO_LINEAR_BIAS", "ProviderFamily", "QUICK_GELU", "SILU", "SQUARED_RELU", "DTYPE", "EXPERTS_FFN", "GELU_ERF", "GELU_TANH", "GPT_CONFIG", "GPT_NEMO_CONSTANTS", "HARMLESS_KEYS",
           "HF_MTP", "HF_MTP_COPIES", "MLA_ROWS", "MOE_HARMLESS", "MOE_NEMO_CONSTANTS", "MOE_ROWS", "MTP_LAYERS", "NEMO_GPT_TARGET",
           "NORM_TOPK_PROB", "REQUIRED", "Check", "ConfigTable", "Derived", "Field", "GPTFeatures", "MoEBlock",
           "NemoCheck", "activation", "activation_choice", "attention_rules", "dense_first_experts", "dense_mlp_rules", "top_two_groups",
           "gpt_family", "gpt_mapping", "layer_windows", "linear_bias_pattern", "linear_biases", "mla_attention_rules",
           "mlp_activation",
           "moe_layers", "moe_mlp_rules", "mtp_rules", "never", "nemo_refusal", "no_per_layer_windows", "norm_rules",
           "num_experts", "partial_rope", "query_pre_attn_scalar", "refuse_unknown_keys", "rope", "set_path", "signature",
           "sliding_window", "softcap", "table_translation"]
