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
    model = model.to(dtype)  # type: ignore[arg-type]  # transformers types .to as PreTrainedModel.to(device)
    model.save_pretrained(folder, safe_serialization=True)
    if tokenizer:
        write_sentencepiece(os.path.join(folder, "tokenizer.model"), vocab_size=min(cfg.vocab_size, 300))
    return folder


def write_training_checkpoint(path: str, weights: dict[str, torch.Tensor], model_cfg: dict[str, Any], *,
                              step: int = 1) -> str:
    """Write a ``.ckpt`` shaped like the one a PyTorch Lightning / NeMo training run saves
    (``trainer.save_checkpoint``), without Lightning: ``state_dict`` (``model.``-prefixed
    NeMo names), Adam ``optimizer_states``, ``lr_schedulers``, ``loops``, ``callbacks`` and
    ``hyper_parameters.cfg`` (the model config). ``weights`` are logical NeMo tensors (as
    ``open_checkpoint`` gives them for a TP = PP = 1 ``.nemo``)."""
    state = {f"model.{k}": v.clone() for k, v in weights.items()}
    adam = {i: {"step": torch.tensor(float(step)), "exp_avg": torch.zeros_like(v), "exp_avg_sq": torch.zeros_like(v)}
            for i, v in enumerate(state.values())}
    ckpt = {
        "epoch": 0,
        "global_step": step,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": state,
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 1, "completed": 0}}}},
        "callbacks": {},
        "optimizer_states": [{"state": adam, "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.98), "eps": 1e-8,
                                                               "weight_decay": 0.0, "params": list(adam)}]}],
        "lr_schedulers": [{"step_size": 10, "gamma": 0.1, "base_lrs": [1e-4], "last_epoch": step}],
        "hparams_name": "kwargs",
        "hyper_parameters": {"cfg": model_cfg},
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(ckpt, path)
    return path
