"""Test-side access to the built-in tiny model builders (see :mod:`nemo_convert.examples`)."""

import os

from nemo_convert.examples import LLAMA_DEFAULTS, corpus, make_tiny_llama, randomize_, write_sentencepiece

__all__ = ["LLAMA_DEFAULTS", "corpus", "hf_tensors", "read_json", "make_tiny_llama", "randomize_", "write_sentencepiece"]


def hf_tensors(folder: str) -> dict:
    """Every tensor of an HF folder, copied out of the memory map (for comparisons)."""
    from nemo_convert.formats.hf.hf import open_hf_weights

    src = open_hf_weights(folder)
    try:
        return {k: src.load(k).clone() for k in src.keys()}
    finally:
        src.close()


def read_json(path: str) -> dict:
    import json

    with open(path, encoding="utf-8") as f:
        return json.load(f)


def edit_config(folder: str, **changes) -> None:
    """Update keys of an HF folder's ``config.json`` in place."""
    import json

    path = os.path.join(folder, "config.json")
    cfg = read_json(path)
    cfg.update(changes)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
