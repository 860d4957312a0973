"""What every process of a ``quantize`` run knows before writing: the opened source (as NeMo
logical tensors) and the checked plan. The driver (:mod:`.driver`) builds it; calibration
(:mod:`.calibrate_once`) reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nemo_convert.convert.checkpoint import Checkpoint
from nemo_convert.plugins.records import ModelFamily
from nemo_convert.qnemo.plan import QuantPlan
from nemo_convert.qnemo.target import TargetPlan
from nemo_convert.tensors.base import TensorSource


@dataclass
class Job:
    """The opened source and the checked plan: what every process knows before writing."""

    ck: Checkpoint
    fam: ModelFamily
    target: TargetPlan
    source: TensorSource             # NeMo logical tensors (an HF folder through its to_nemo plan)
    plan: QuantPlan
    tok_section: dict[str, Any] | None
    tok_files: dict[str, bytes]
    warnings: list[str] = field(default_factory=list)  # completing a NeMo-native config
    ignore_config_keys: tuple[str, ...] = ()
    n_params: int = 0                # the source's parameters (sizes the default calibration)

    def close(self) -> None:
        self.ck.close()
