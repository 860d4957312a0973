"""nemo-convert: convert checkpoints into and out of NVIDIA NeMo formats.

The public Python API lives in :mod:`nemo_convert.api`; plugin authors use
:data:`hookimpl`, the records (:class:`ModelFamily`, …) and :mod:`nemo_convert.mapping`.
"""

from nemo_convert.plugins.hookspecs import hookimpl
from nemo_convert.plugins.records import (CommandOption, FamilyOptions, HFSide, ModelFamily, NemoTarget, OutputJob,
                                         OutputTarget, QuantSettings, ResultTable, RunnableModel, ShardingStrategy,
                                         TokenizerPatcher, Verifier, VerifierResult, WriteStats)

__version__ = "0.1.0"

__all__ = ["CommandOption", "FamilyOptions", "HFSide", "ModelFamily", "NemoTarget", "OutputJob", "OutputTarget",
           "QuantSettings", "ResultTable", "RunnableModel", "ShardingStrategy", "TokenizerPatcher", "Verifier", "VerifierResult", "WriteStats",
           "__version__", "hookimpl"]
