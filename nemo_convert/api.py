"""The public Python API: everything the CLI does, as functions.

>>> from nemo_convert import api
>>> report = api.import_hf("llama-hf/", "llama.nemo")              # doctest: +SKIP
>>> report = api.export_hf("llama.nemo", "llama-back/")             # doctest: +SKIP
>>> report = api.reshard("llama.nemo", "mb/", to="megatron-bridge")   # doctest: +SKIP
>>> with api.open_checkpoint("llama.nemo") as ckpt:                 # doctest: +SKIP
...     w = ckpt.source.load("embedding.word_embeddings.weight")
>>> api.get_registry().families                                     # doctest: +SKIP
"""

from __future__ import annotations

from nemo_convert.convert.checkpoint import Checkpoint, inspect_checkpoint, open_checkpoint
from nemo_convert.convert.common import SECTION, ConversionReport
from nemo_convert.convert.from_ckpt import from_ckpt
from nemo_convert.convert.hf_to_nemo import import_hf, plan_import
from nemo_convert.convert.nemo_to_hf import export_hf
from nemo_convert.convert.nemo_write import Parallelism
from nemo_convert.convert.reshard import reshard
from nemo_convert.convert.to_megatron_bridge import TARGETS
from nemo_convert.convert.tokenizer_patch import add_tokens
from nemo_convert.formats.hf.hub import resolve_hf_source
from nemo_convert.formats.megatron.megatron_dir import is_megatron_dir
from nemo_convert.plugins.manager import get_registry, registry_with
from nemo_convert.qnemo import QuantizeReport, quantize
from nemo_convert.verify import VerifyReport, verify

__all__ = ["SECTION", "Checkpoint", "QuantizeReport", "quantize", "VerifyReport", "add_tokens", "verify", "ConversionReport", "Parallelism", "reshard", "export_hf", "from_ckpt", "get_registry", "import_hf",
           "inspect_checkpoint", "open_checkpoint", "plan_import", "registry_with", "TARGETS", "is_megatron_dir",
           "resolve_hf_source"]
