"""Calibration: activation statistics of a model's linear layers, and calibration text.

:func:`collect_activation_stats` runs batches through a (transformers) model with a
forward pre-hook on every selected :class:`torch.nn.Linear` and records, per module,

* ``input_amax`` — max ``|x|`` over all calibration tokens (FP8 activation scale);
* ``act_mean`` — per-input-channel mean ``|x|`` (AWQ);
* ``samples`` — a uniform random sample of input rows (AWQ's output-error search);
* ``output_amax`` — max ``|y|`` of the module's output, for ``k_proj`` / ``v_proj``
  (FP8 KV-cache scale).

A mixture-of-experts layer whose experts are not ``Linear`` modules — transformers v5 keeps a
layer's experts as one module with 3-D ``gate_up_proj`` ``[E, 2I, H]`` (rows ``[gate; up]``)
and ``down_proj`` ``[E, H, I]`` parameters and an ``act_fn`` (``MixtralExperts``,
``Qwen2MoeExperts``, ``Qwen3MoeExperts`` in ``transformers/models/*/modeling_*.py``) — is
calibrated expert by expert under the names ``{module}.gate_up_proj.{e}`` and
``{module}.down_proj.{e}``, with *every* token through *every* expert (the inputs of
``gate_up_proj`` are the layer's tokens; those of ``down_proj`` are ``act(gate)·up`` computed
from the expert's own weights): routing sends a calibration set's tokens to few experts, and
every expert needs a range. This is how quantizers calibrate MoE layers (llm-compressor's
MoE calibration modules, ``calibrate_all_experts=True``); TensorRT-LLM then takes the max
over the experts for the layer's one activation scale.

Padding positions (``attention_mask == 0``) are left out. Statistics accumulate in
float32 on the model's device, so the same code runs on CPU and CUDA.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import torch

from nemo_convert.errors import ConfigError

#: Output modules whose output amax is recorded by default (the KV-cache scale inputs).
KV_MODULES: tuple[str, ...] = ("k_proj", "v_proj")
CALIBRATION_FILE = "calibration_en.txt"


@dataclass
class Stats:
    """Calibration statistics of one linear module's input (and maybe output)."""

    input_amax: torch.Tensor              # 0-d float32
    act_mean: torch.Tensor                # [in] float32, mean |x| per input channel
    samples: torch.Tensor                 # [k, in] float32, k ≤ max_samples
    n_tokens: int
    output_amax: torch.Tensor | None = None   # 0-d float32, for KV modules only


def merge_stats(parts: Sequence[Stats], max_samples: int | None = None) -> Stats:
    """Combine statistics of modules fused into one linear (e.g. q/k/v, gate/up).

    Fused modules read the same input, so this is mostly a consistency merge:
    amax is the max, ``act_mean`` the token-weighted mean, samples are concatenated
    (then cut to ``max_samples``), and ``output_amax`` the max of those present.
    """
    if not parts:
        raise ValueError("merge_stats needs at least one Stats")
    n = sum(p.n_tokens for p in parts)
    amax = torch.stack([p.input_amax for p in parts]).amax()
    mean = cast(torch.Tensor, sum(p.act_mean * p.n_tokens for p in parts)) / max(n, 1)  # (parts is not empty)
    samples = torch.cat([p.samples for p in parts], dim=0)
    if max_samples is not None:
        samples = samples[:max_samples]
    outs = [p.output_amax for p in parts if p.output_amax is not None]
    out_amax = torch.stack(outs).amax() if outs else None
    return Stats(amax, mean, samples, n, out_amax)


class _Accumulator:
    """Running statistics of one module; all tensors stay on the activation's device."""

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self.amax: torch.Tensor | None = None
        self.abs_sum: torch.Tensor | None = None
        self.n = 0
        self.samples: torch.Tensor | None = None
        self.keys: torch.Tensor | None = None   # random priority of each kept sample
        self.out_amax: torch.Tensor | None = None

    def add_input(self, rows: torch.Tensor, gen: torch.Generator) -> None:
        """Fold ``rows`` (``[n, in]``) into the statistics."""
        if rows.shape[0] == 0:
            return
        rows = rows.detach().float()
        a = rows.abs()
        m = a.amax()
        s = a.sum(dim=0)
        self.amax = m if self.amax is None else torch.maximum(self.amax, m)
        self.abs_sum = s if self.abs_sum is None else self.abs_sum + s
        self.n += rows.shape[0]
        if self.max_samples <= 0:
            return
        # Bottom-k sampling: every row gets a uniform random key and the k rows with the
        # smallest keys are kept — a uniform sample over the whole stream.
        keys = torch.rand(rows.shape[0], generator=gen).to(rows.device)
        if self.samples is not None and self.keys is not None:
            rows = torch.cat([self.samples, rows], dim=0)
            keys = torch.cat([self.keys, keys], dim=0)
        if rows.shape[0] > self.max_samples:
            keep = torch.topk(keys, self.max_samples, largest=False).indices
            rows, keys = rows[keep], keys[keep]
        self.samples, self.keys = rows, keys

    def add_output(self, out: torch.Tensor) -> None:
        """Fold the module's (masked) output into ``out_amax``."""
        if out.numel() == 0:
            return
        m = out.detach().float().abs().amax()
        self.out_amax = m if self.out_amax is None else torch.maximum(self.out_amax, m)

    def finish(self, in_features: int, to_cpu: bool) -> Stats:
        assert self.amax is not None and self.abs_sum is not None
        samples = self.samples if self.samples is not None else \
            torch.zeros(0, in_features, device=self.amax.device)
        st = Stats(self.amax, self.abs_sum / self.n, samples, self.n, self.out_amax)
        if to_cpu:
            st = Stats(st.input_amax.cpu(), st.act_mean.cpu(), st.samples.cpu(), st.n_tokens,
                       None if st.output_amax is None else st.output_amax.cpu())
        return st


def fused_experts(module: torch.nn.Module) -> int:
    """The number of experts of a transformers v5 fused-experts module (3-D ``gate_up_proj``
    ``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]``, an ``act_fn``), else 0."""
    gu, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gu, torch.Tensor) or not isinstance(down, torch.Tensor) or gu.dim() != 3 or down.dim() != 3:
        return 0
    e, two_i, h = gu.shape
    if down.shape != (e, h, two_i // 2) or two_i % 2 or not callable(getattr(module, "act_fn", None)):
        return 0
    return int(e)


def _selected(name: str, patterns: Sequence[str] | None) -> bool:
    return patterns is None or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _batch_inputs(batch: Any, device: torch.device) -> dict[str, torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        ids = batch if batch.dim() == 2 else batch.reshape(1, -1)
        return {"input_ids": ids.to(device)}
    if isinstance(batch, Mapping):
        if "input_ids" not in batch:
            raise ConfigError("a calibration batch mapping needs 'input_ids'")
        return {k: v.to(device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    raise ConfigError(f"a calibration batch must be a tensor of token ids or a mapping, "
                      f"got {type(batch).__name__}")


def collect_activation_stats(model: torch.nn.Module, batches: Iterable[Any],
                             layers: Sequence[str] | None = None, *,
                             kv_modules: Sequence[str] = KV_MODULES,
                             max_samples: int = 64, seed: int = 0,
                             device: torch.device | str | None = None,
                             to_cpu: bool = True) -> dict[str, Stats]:
    """Run ``batches`` through ``model`` and return :class:`Stats` per linear module.

    ``batches`` yields ``[b, t]`` token-id tensors or mappings with ``input_ids`` (and
    optionally ``attention_mask``). ``layers`` are fnmatch patterns over module names
    (e.g. ``"model.layers.*.mlp.*"``); ``None`` selects every ``nn.Linear``. Modules
    whose last name component is in ``kv_modules`` also get ``output_amax``. Inputs
    go to ``device`` (default: the model's first parameter's device); the model must
    already be there. Modules that never ran are absent from the result.
    """
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    accs: dict[str, _Accumulator] = {}
    widths: dict[str, int] = {}
    mask_holder: dict[str, torch.Tensor | None] = {"mask": None}

    def rows_of(t: torch.Tensor) -> torch.Tensor:
        flat = t.reshape(-1, t.shape[-1])
        mask = mask_holder["mask"]
        if mask is not None and mask.numel() == flat.shape[0]:
            flat = flat[mask]
        return flat

    def make_pre_hook(name: str):
        def hook(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
            if args and isinstance(args[0], torch.Tensor):
                accs[name].add_input(rows_of(args[0]), gen)
        return hook

    def make_out_hook(name: str):
        def hook(module: torch.nn.Module, args: tuple[Any, ...], out: Any) -> None:
            if isinstance(out, torch.Tensor):
                accs[name].add_output(rows_of(out))
        return hook

    def make_experts_hook(name: str, experts: int):
        def hook(module: Any, args: tuple[Any, ...]) -> None:  # a fused-experts module (transformers 5)
            if not args or not isinstance(args[0], torch.Tensor):
                return
            x = rows_of(args[0])
            for e in range(experts):
                gate, up = torch.nn.functional.linear(x, module.gate_up_proj[e]).chunk(2, dim=-1)
                accs[f"{name}.gate_up_proj.{e}"].add_input(x, gen)
                accs[f"{name}.down_proj.{e}"].add_input(module.act_fn(gate) * up, gen)
        return hook

    handles = []
    for name, module in model.named_modules():
        experts = fused_experts(module)
        if experts and any(_selected(f"{name}.{p}.{e}", layers) for p in ("gate_up_proj", "down_proj")
                           for e in range(experts)):
            for e in range(experts):
                for p, width in (("gate_up_proj", module.gate_up_proj.shape[2]),
                                 ("down_proj", module.down_proj.shape[2])):
                    accs[f"{name}.{p}.{e}"] = _Accumulator(max_samples)
                    widths[f"{name}.{p}.{e}"] = int(width)
            handles.append(module.register_forward_pre_hook(make_experts_hook(name, experts)))
            continue
        if isinstance(module, torch.nn.Linear) and _selected(name, layers):
            accs[name] = _Accumulator(max_samples)
            widths[name] = module.in_features
            handles.append(module.register_forward_pre_hook(make_pre_hook(name)))
            if name.rsplit(".", 1)[-1] in kv_modules:
                handles.append(module.register_forward_hook(make_out_hook(name)))
    if not accs:
        raise ConfigError("no nn.Linear module matches the calibration layer patterns")

    was_training = model.training
    model.eval()
    extra = {"use_cache": False} if hasattr(model, "config") else {}
    try:
        with torch.no_grad():
            for batch in batches:
                inputs = _batch_inputs(batch, device)
                am = inputs.get("attention_mask")
                mask_holder["mask"] = None if am is None else am.reshape(-1).bool()
                model(**inputs, **extra)
    finally:
        mask_holder["mask"] = None
        for h in handles:
            h.remove()
        model.train(was_training)
    return {name: acc.finish(widths[name], to_cpu)
            for name, acc in accs.items() if acc.n > 0}


def builtin_calibration_texts() -> list[str]:
    """The built-in English calibration sample: one paragraph or sentence per entry."""
    text = resources.files("nemo_convert.quant").joinpath(CALIBRATION_FILE).read_text(
        encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def _encode(tokenizer: Any, text: str) -> list[int]:
    if callable(tokenizer):
        out = tokenizer(text, add_special_tokens=False)
        ids = out["input_ids"] if isinstance(out, Mapping) or hasattr(out, "keys") else out
    else:
        ids = tokenizer.encode(text, add_special_tokens=False)
    return [int(i) for i in ids]


def tokenize_calibration(tokenizer: Any, texts: Sequence[str], max_len: int,
                         n: int) -> torch.Tensor:
    """``n`` rows of ``max_len`` token ids (int64 ``[n, max_len]``) cut from ``texts``.

    The texts are tokenized without special tokens and joined (with the tokenizer's
    EOS id between them when it has one) into one stream, repeated if it is too short.
    Each row starts with BOS when the tokenizer defines one. No padding is needed.
    """
    if max_len < 2 or n < 1:
        raise ValueError(f"need max_len ≥ 2 and n ≥ 1, got max_len={max_len}, n={n}")
    eos = getattr(tokenizer, "eos_token_id", None)
    bos = getattr(tokenizer, "bos_token_id", None)
    stream: list[int] = []
    for t in texts:
        ids = _encode(tokenizer, t)
        if ids:
            stream.extend(ids)
            if eos is not None:
                stream.append(int(eos))
    if not stream:
        raise ConfigError("the calibration texts produced no tokens")
    body = max_len - (1 if bos is not None else 0)
    need = n * body
    reps = -(-need // len(stream))
    flat = torch.tensor((stream * reps)[:need], dtype=torch.int64).reshape(n, body)
    if bos is not None:
        flat = torch.cat([torch.full((n, 1), int(bos), dtype=torch.int64), flat], dim=1)
    return flat
