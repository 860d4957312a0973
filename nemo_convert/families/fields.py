"""The typed model spec's fields that the shared rule sets read, named once.

A rule's condition and the symbolic dimensions of its shapes are
:class:`~nemo_convert.mapping.rules.base.SpecField` s of
:class:`~nemo_convert.spec.model.ModelSpec` (checked against its dataclass fields here, at
import): ``when=TIED`` / ``when=~TIED``, ``shape=(HIDDEN,)``. A family plugin uses these, or
names its own (``SpecField("attention.window")``).
"""

from __future__ import annotations

from nemo_convert.mapping.rules.base import SpecField

#: the output layer is the word embedding (NeMo ``share_embeddings_and_output_weights``)
TIED = SpecField("embedding.tied")
#: the norm weights store γ - 1 (NeMo ``layernorm_zero_centered_gamma``, ``layernorm1p``)
ZERO_CENTRED = SpecField("norm.zero_centred")
#: the hidden size (``hidden_size``)
HIDDEN = SpecField("geometry.hidden")
#: the dense MLP's size (``ffn_hidden_size``)
FFN = SpecField("geometry.ffn")
#: attention heads (``num_attention_heads``)
HEADS = SpecField("geometry.heads")
#: one head's size (``kv_channels``, null: hidden / heads)
HEAD_DIM = SpecField("geometry.head_dim")
#: the learned position table's rows (``max_position_embeddings``)
MAX_POSITIONS = SpecField("geometry.max_positions")
#: the true vocabulary, None when not recorded (our ``nemo_convert.vocab_size``)
VOCAB = SpecField("geometry.vocab_size")
#: multi-latent attention's query and key/value ranks (``q_lora_rank``, ``kv_lora_rank``)
Q_LORA_RANK = SpecField("attention.mla.q_lora_rank")
KV_LORA_RANK = SpecField("attention.mla.kv_lora_rank")
#: routed experts (``num_moe_experts``)
EXPERTS = SpecField("moe.experts")
#: one expert's MLP size (``moe_ffn_hidden_size``, null: ``ffn_hidden_size``)
EXPERT_FFN = SpecField("moe.ffn")
#: the shared experts' MLP size (``moe_shared_expert_intermediate_size``)
SHARED_FFN = SpecField("moe.shared_ffn")
#: the shared experts' output is gated (``moe_shared_expert_gate``)
SHARED_GATE = SpecField("moe.shared_gate")
#: per layer, whether it is a mixture-of-experts layer (``moe_layer_freq``):
#: ``MOE_LAYER_PATTERN.layers()`` is the ``{i:…}`` of those layers, ``(~…).layers()`` the others
MOE_LAYER_PATTERN = SpecField("moe.layer_pattern")
#: a hybrid stack's per-layer symbols (``hybrid_override_pattern``):
#: ``LAYER_KINDS.layers("M")`` is the ``{i:…}`` of its Mamba layers
LAYER_KINDS = SpecField("layer_kinds")
