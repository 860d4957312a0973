"""The NeMo 2 config classes of GPT-OSS (NeMo 8cfedd7 ``nemo/collections/llm/gpt/model/gpt_oss.py``),
declared as refusals."""

from __future__ import annotations

_GPT_OSS = "nemo.collections.llm.gpt.model.gpt_oss."

#: NeMo 2's GPT-OSS configs (lines 45-103) spell YaRN as ``rotary_scaling_factor: 32`` and
#: ``yarn_original_max_position_embeddings: 131072`` (lines 64-70), while ``HFGPTOSSExporter.config``
#: (lines 510-518) writes transformers' GptOssConfig defaults (factor 32, original 4096).
WHY = ("its YaRN is rotary_scaling_factor (Megatron-Core 0.16's GPTModel reads yarn_rotary_scaling_factor) with "
       "original context 131072 by default, where gpt-oss's and NeMo's own HF export's is 4096, so which YaRN the "
       "checkpoint ran is not recorded")

NEMO2_CONFIGS: dict[str, dict[str, object] | str] = {
    _GPT_OSS + name: WHY for name in ("GPTOSSConfig", "GPTOSSConfig120B", "GPTOSSConfig20B")}
