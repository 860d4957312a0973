"""Test-side access to the built-in tiny model builders (see :mod:`nemo_convert.examples`)."""

from nemo_convert.examples import LLAMA_DEFAULTS, corpus, make_tiny_llama, randomize_, write_sentencepiece

__all__ = ["LLAMA_DEFAULTS", "corpus", "make_tiny_llama", "randomize_", "write_sentencepiece"]
