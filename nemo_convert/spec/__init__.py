"""The typed model spec: what a decoder computes, read once, and the tables over it.

* :mod:`.model` — the frozen records (:class:`ModelSpec` and its parts, :class:`Provenance`);
* :mod:`.nemo` — the one reader of NeMo 1's ``model_config.yaml`` (:func:`spec_of`,
  :func:`provenance_of`), with NeMo's defaults and our side channels interpreted once;
* :mod:`.activations`, :mod:`.precision` — the activation names and dtype spellings every
  config form shares;
* :mod:`.compare` — two specs compared as architectures (export's check, the family choice).

This package sits just above the base layer (``tests/test_architecture.py``): the
mapping, the formats, the families and ``quantize`` all read it; it reads no file.
"""

from nemo_convert.spec.activations import describe_activation, mcore_activation, nemo_activation
from nemo_convert.spec.compare import NOT_COMPARED, first_difference, signature
from nemo_convert.spec.model import (LLAMA3_DEFAULTS, MLA, MLP, Attention, Block, Embedding, Geometry, Llama3Scaling,
                                     ModelSpec, MoE, Norm, Provenance, Rope, YarnScaling)
from nemo_convert.spec.nemo import (MLA_PLAIN, UNMODELLED, geometry_of, head_dim, layer_pattern, layer_symbols, linear_biases, llama3_scaling,
                                    mamba_dims, megatron_window, provenance_of, query_groups, recorded_vocab, rope_of, section, sliding_window,
                                    spec_of, window_keys, window_pattern, yarn_scaling)
from nemo_convert.spec.precision import dtype_name_of_flags, dtype_name_of_precision, precision_of_dtype_name

__all__ = ["LLAMA3_DEFAULTS", "MLA", "MLA_PLAIN", "MLP", "NOT_COMPARED", "UNMODELLED", "Attention", "Block", "Embedding", "Geometry",
           "Llama3Scaling", "ModelSpec", "MoE", "Norm", "Provenance", "Rope", "YarnScaling", "describe_activation",
           "dtype_name_of_flags", "dtype_name_of_precision", "first_difference", "geometry_of", "head_dim", "layer_pattern",
           "layer_symbols", "linear_biases", "llama3_scaling", "mamba_dims", "mcore_activation", "megatron_window", "nemo_activation", "precision_of_dtype_name",
           "provenance_of", "query_groups", "recorded_vocab", "rope_of", "section", "signature", "sliding_window", "spec_of",
           "window_keys", "window_pattern", "yarn_scaling"]
