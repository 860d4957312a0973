"""Builders of PyTorch Lightning training checkpoints for the ``from-ckpt`` tests.

Every ``.ckpt`` here is written by Lightning's own ``Trainer`` (``fit`` for one step with
Adam, so optimizer and scheduler state exist, then ``save_checkpoint``) from a tiny
``LightningModule`` whose ``model`` attribute holds NeMo-named parameters (and
Transformer-Engine-like ``_extra_state`` entries). Distributed checkpoints are written with
our ``DistCheckpointWriter`` or torch DCP, with a ``common.pt`` taken from a real
Lightning checkpoint.
"""

from __future__ import annotations

import copy
import io
import json
import os
import tarfile
import warnings
from typing import Any

import torch
from pickle_fakes import fake_omegaconf, omegaconf_tree

from nemo_convert import api
from nemo_convert.convert.common import SECTION

GEOM = dict(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=300, max_position_embeddings=64)
CKPT_NAME = "megatron_gpt--val_loss=1.23-step=1-last.ckpt"


# ------------------------------------------------------------------ .nemo helpers
def nemo_tensors(path: str) -> dict[str, torch.Tensor]:
    """Every logical tensor of a ``.nemo`` (any layout), read through the public API."""
    with api.open_checkpoint(path) as ck:
        return {k: ck.source.load(k).clone() for k in ck.source.keys()}


def nemo_config(path: str) -> dict[str, Any]:
    with api.open_checkpoint(path) as ck:
        return copy.deepcopy(ck.config)


def rank_state(nemo: str, folder: str | None) -> dict[str, torch.Tensor]:
    """The ``model.``-prefixed state dict of one rank of a legacy ``.nemo``."""
    member = f"./{folder}/model_weights.ckpt" if folder else "./model_weights.ckpt"
    with tarfile.open(nemo) as tar:
        f = tar.extractfile(member)
        assert f is not None
        return torch.load(io.BytesIO(f.read()), weights_only=True)


def training_config(nemo_cfg: dict[str, Any], *, keep_section: bool = False, tokenizer: str | None = "tokenizer.model",
                    tp: int = 1, pp: int = 1) -> dict[str, Any]:
    """A model config as a NeMo training run has it: the ``.nemo`` config with a local
    tokenizer path, the run's TP/PP and training sections (without our own section unless
    ``keep_section``: a run restored from a ``.nemo`` we wrote keeps it)."""
    cfg = copy.deepcopy(nemo_cfg)
    if not keep_section:
        cfg.pop(SECTION, None)
    cfg["tokenizer"] = dict(cfg.get("tokenizer") or {}, library="sentencepiece", model=tokenizer)
    cfg["tensor_model_parallel_size"] = tp
    cfg["pipeline_model_parallel_size"] = pp
    cfg["optim"] = {"name": "fused_adam", "lr": 1.0e-4, "betas": [0.9, 0.98],
                    "sched": {"name": "CosineAnnealing", "warmup_steps": 10}}
    cfg["data"] = {"data_prefix": ["1.0", "/data/train_text_document"], "seq_length": 64}
    return cfg


# ------------------------------------------------------------- Lightning modules
class _TELinear(torch.nn.Module):
    """A module with Transformer-Engine style ``_extra_state``: a ``BytesIO`` (older TE) for
    the attention linears, an 8-byte ``uint8`` tensor (newer TE) for the MLP ones."""

    def __init__(self, as_tensor: bool) -> None:
        super().__init__()
        self.as_tensor = as_tensor

    def get_extra_state(self) -> Any:
        return torch.zeros(8, dtype=torch.uint8) if self.as_tensor else io.BytesIO(b"")

    def set_extra_state(self, state: Any) -> None:
        pass


def _module_for(root: torch.nn.Module, path: list[str]) -> torch.nn.Module:
    m = root
    for part in path:
        if not hasattr(m, part):
            m.add_module(part, _TELinear(part.startswith("linear_fc")) if part.startswith("linear_")
                         else torch.nn.Module())
        m = getattr(m, part)
    return m


def build_module(state: dict[str, torch.Tensor], cfg: dict[str, Any] | None):  # type: ignore[no-untyped-def]
    """A LightningModule whose ``state_dict`` is ``state`` (``model.``-prefixed names) plus
    ``_extra_state`` entries, with ``{"cfg": cfg}`` as hyper-parameters."""
    import lightning as L

    class TinyNemoModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            if cfg is not None:
                self.save_hyperparameters({"cfg": cfg})
            self.model = torch.nn.Module()
            for name, t in state.items():
                assert name.startswith("model."), name
                *path, leaf = name[len("model."):].split(".")
                _module_for(self.model, path).register_parameter(leaf, torch.nn.Parameter(t.clone()))

        def training_step(self, batch: Any, idx: int) -> torch.Tensor:
            return sum((p.float() ** 2).sum() for p in self.parameters()) * 1e-3 * batch[0].sum()

        def configure_optimizers(self) -> Any:
            opt = torch.optim.Adam(self.parameters(), lr=1e-3)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 10)}

    return TinyNemoModule()


def lightning_save(state: dict[str, torch.Tensor], cfg: dict[str, Any] | None, path: str) -> str:
    """Fit a module holding ``state`` for one Adam step, put the weights back to ``state``
    exactly, and ``trainer.save_checkpoint(path)``."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    module = build_module(state, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's hints about workers, loggers, deprecations
        trainer = L.Trainer(max_steps=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module, DataLoader(TensorDataset(torch.ones(1, 1)), batch_size=1))
    with torch.no_grad():
        params = dict(module.named_parameters())
        for name, t in state.items():
            params[name].copy_(t)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    trainer.save_checkpoint(path)
    return path


def optimizer_size(path: str) -> tuple[int, int]:
    """``(tensors, bytes)`` of ``optimizer_states`` in a ``.ckpt``, counted independently."""
    ck = torch.load(path, map_location="cpu", weights_only=False)
    n = b = 0
    for opt in ck["optimizer_states"]:
        for per_param in opt["state"].values():
            for v in per_param.values():
                if isinstance(v, torch.Tensor):
                    n += 1
                    b += v.numel() * v.element_size()
    return n, b


# -------------------------------------------------------------- dist checkpoints
def _stack(logical: dict[str, torch.Tensor]) -> dict[str, list[tuple[int | None, torch.Tensor]]]:
    """Logical names → stacked ``model.``-prefixed keys with their per-layer pieces."""
    from nemo_convert.sharding.layout import split_layer_name

    out: dict[str, list[tuple[int | None, torch.Tensor]]] = {}
    for name, t in logical.items():
        parts = split_layer_name(name)
        if parts:
            stack, i, rest = parts
            out.setdefault(f"model.{stack}.{rest}", []).append((i, t))
        else:
            out[f"model.{name}"] = [(None, t)]
    return out


def lightning_common(state: dict[str, torch.Tensor], cfg: dict[str, Any], tmp: str) -> dict[str, Any]:
    """What NeMo's dist strategy keeps in ``common.pt``: a real Lightning checkpoint dict
    with the weights and optimizer tensors moved out (into the sharded part)."""
    path = lightning_save(state, cfg, os.path.join(tmp, "for_common.ckpt"))
    ck = torch.load(path, map_location="cpu", weights_only=False)
    os.remove(path)
    ck["state_dict"] = {}
    ck["optimizer_states"] = [{"param_groups": o["param_groups"]} for o in ck["optimizer_states"]]
    return ck


def write_dist_checkpoint(folder: str, logical: dict[str, torch.Tensor], common: dict[str, Any], *,
                          tp: int = 2) -> tuple[int, int]:
    """A NeMo-style dist training checkpoint written by ``tp`` "ranks" (one data file each,
    tensors cut along dim 0): stacked ``model.`` weights, ``optimizer.state.exp_avg.…``
    tensors, ``_extra_state`` objects and a Lightning ``common.pt``. Returns the
    ``(tensors, bytes)`` of the optimizer part."""
    from nemo_convert.formats.dist_checkpoint.distckpt_write import DistCheckpointWriter, write_dist_metadata
    from nemo_convert.formats.io.sink import DirectorySink

    sink = DirectorySink(folder)
    writers = [DistCheckpointWriter(sink, "", data_file=f"__{r}_0.distcp") for r in range(tp)]
    stacked = _stack(logical)
    g = torch.Generator().manual_seed(1)
    opt = (0, 0)
    for key, pieces in stacked.items():
        layered = pieces[0][0] is not None
        shape = ((len(pieces),) if layered else ()) + tuple(pieces[0][1].shape)
        opt_key = "optimizer.state.exp_avg." + key
        for w in writers:
            w.declare(key, shape, pieces[0][1].dtype)
            w.declare(opt_key, shape, torch.float32)
        opt = (opt[0] + 1, opt[1] + torch.Size(shape).numel() * 4)
        for i, t in pieces:
            for k, value in ((key, t), (opt_key, torch.randn(t.shape, generator=g))):
                full = value.unsqueeze(0) if layered else value
                base = [i if layered and d == 0 else 0 for d in range(full.dim())]
                d = 1 if layered else 0
                if full.dim() > d and full.shape[d] % tp == 0:  # each rank writes its rows
                    n = full.shape[d] // tp
                    for r, w in enumerate(writers):
                        offs = list(base)
                        offs[d] += r * n
                        w.write_chunk(k, offs, full.narrow(d, r * n, n))
                else:
                    writers[0].write_chunk(k, base, full)
        if key.endswith(("linear_qkv.weight", "linear_fc1.weight")):
            mod = key[: -len(".weight")]
            for i, _ in pieces:
                writers[0].add_extra_state(mod + "._extra_state", i, len(pieces))
    records = [w.close(finalize=False) for w in writers]
    write_dist_metadata(sink, "", records)
    torch.save(common, os.path.join(folder, "common.pt"))
    return opt


def write_dcp_checkpoint(folder: str, logical: dict[str, torch.Tensor], common: dict[str, Any]) -> tuple[int, int]:
    """A torch DCP save of a Lightning-style dict (``state_dict`` and ``optimizer``
    sub-dicts, so keys read ``state_dict.model.…``), plus ``metadata.json`` and ``common.pt``."""
    import torch.distributed.checkpoint as dcp

    weights, exp_avg = {}, {}
    for key, pieces in _stack(logical).items():
        t = torch.stack([p for _, p in pieces]) if pieces[0][0] is not None else pieces[0][1]
        weights[key] = t.clone()
        exp_avg[key] = torch.zeros(t.shape, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"state_dict": weights, "optimizer": {"state": {"exp_avg": exp_avg}}}, checkpoint_id=folder)
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
                   "common_backend_version": 1}, f)
    torch.save(common, os.path.join(folder, "common.pt"))
    return len(exp_avg), sum(t.numel() * 4 for t in exp_avg.values())


# ------------------------------------------------------------ hostile or odd pickles
class RunsCommand:
    """Pickles as a call of ``os.system(command)``: what a malicious checkpoint does."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> Any:
        return (os.system, (self.command,))


__all__ = ["CKPT_NAME", "GEOM", "RunsCommand", "build_module", "fake_omegaconf", "lightning_common",
           "lightning_save", "nemo_config", "nemo_tensors", "omegaconf_tree", "optimizer_size", "rank_state",
           "training_config", "write_dcp_checkpoint", "write_dist_checkpoint"]
