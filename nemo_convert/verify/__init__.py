"""Compare two checkpoints through the family mapping: tensors, configs, tokenizers.

>>> from nemo_convert.verify import verify
>>> rep = verify("llama-hf/", "llama.nemo")                    # doctest: +SKIP
>>> rep.ok, rep.worst(3)                                      # doctest: +SKIP
"""

from nemo_convert.verify.core import verify
from nemo_convert.verify.report import (ConfigDiff, EncodingDiff, SideInfo, TensorDiff, TokenizerFileDiff,
                                        TokenizerReport, VerifyReport)
from nemo_convert.verify.tensors import HFView, compare_tensors
from nemo_convert.verify.tokenizers import PROBE_TEXTS, compare_tokenizers

__all__ = ["PROBE_TEXTS", "ConfigDiff", "EncodingDiff", "HFView", "SideInfo", "TensorDiff",
           "TokenizerFileDiff", "TokenizerReport", "VerifyReport", "compare_tensors", "compare_tokenizers", "verify"]
