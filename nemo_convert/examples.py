"""Built-in example models: tiny random Hugging Face checkpoints made on the spot.

Used by ``nemo-convert demo``, the tests and the benchmark; nothing is downloaded. Every
parameter is randomised (norms too, so that a swapped norm cannot go unnoticed).
"""

from __future__ import annotations

import io
import os
import random
from typing import Any

import torch

LLAMA_DEFAULTS: dict[str, Any] = dict(
    vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
    tie_word_embeddings=False,
)

_WORDS = ("the quick brown fox jumps over the lazy dog a converter streams tensors from one format to "
          "another large language models are trained on many tokens checkpoints hold weights configs and "
          "tokenizers tensor parallel ranks each hold a slice of a matrix pipeline stages hold layers").split()


def randomize_(model: torch.nn.Module, seed: int = 0, scale: float = 0.2) -> None:
    """Overwrite every parameter of ``model`` with seeded Gaussian noise."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.randn(p.shape, generator=g) * scale).to(p.dtype))


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    """``n`` short generated English-like sentences."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14))) for _ in range(n)]


def write_sentencepiece(path: str, *, vocab_size: int = 200, model_type: str = "bpe") -> str:
    """Train a tiny SentencePiece model on a generated corpus and write it to ``path``."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus()), model_writer=buf, vocab_size=vocab_size,
                                   model_type=model_type, character_coverage=1.0, bos_id=1, eos_id=2,
                                   unk_id=0, pad_id=-1, hard_vocab_limit=False, minloglevel=2)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return path


def make_tiny_llama(folder: str, *, dtype: torch.dtype = torch.float32, seed: int = 0,
                    tokenizer: bool = True, **overrides: Any) -> str:
    """Save a random ``LlamaForCausalLM`` (and a small SentencePiece tokenizer) in ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{**LLAMA_DEFAULTS, **overrides})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    randomize_(model, seed)
    model = model.to(dtype)
    model.save_pretrained(folder, safe_serialization=True)
    if tokenizer:
        write_sentencepiece(os.path.join(folder, "tokenizer.model"), vocab_size=min(cfg.vocab_size, 300))
    return folder
