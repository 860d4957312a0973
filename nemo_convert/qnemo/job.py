"""What every process of a ``quantize`` run knows before writing: the source as NeMo
logical tensors, the model as transformers runs it (for calibration) and the checked plan.
The ``trtllm`` target's writer (:mod:`.target_writer`) builds it from its
:class:`~nemo_convert.plugins.records.OutputJob`; calibration (:mod:`.calibrate_once`)
reads it."""

from __future__ import annotations

from dataclasses import dataclass, field

from nemo_convert.plugins.records import ModelFamily, RunnableModel
from nemo_convert.qnemo.plan import QuantPlan
from nemo_convert.qnemo.target import TargetPlan
from nemo_convert.tensors.base import TensorSource


@dataclass
class Job:
    """The planned source and the checked plan: what every process knows before writing."""

    fam: ModelFamily
    target: TargetPlan
    source: TensorSource             # NeMo logical tensors (an HF folder through its to_nemo plan)
    plan: QuantPlan
    model: RunnableModel             # the model transformers loads (calibration runs it)
    tok_files: dict[str, bytes]      # the tokenizer members, tokenizer_config.yaml included
    warnings: list[str] = field(default_factory=list)
    n_params: int = 0                # the source's parameters (sizes the default calibration)

    @property
    def ignore_config_keys(self) -> tuple[str, ...]:
        return self.model.ignore_config_keys
