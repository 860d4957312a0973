"""Expert parallelism: which experts of a mixture-of-experts layer live on which rank.

Megatron-Core gives EP rank r the contiguous experts ``r·E/EP … (r+1)·E/EP − 1`` (its
local expert j is global expert ``r·E/EP + j``), and its dist checkpoint stores every
expert under its global index whatever the EP size: a dist ``.nemo`` written at any EP
holds the same tensors, with ``expert_model_parallel_size`` recorded in the config.
NeMo's legacy per-rank layout (``mp_rank_XX`` / ``tp_rank_XX_pp_rank_YYY``) has no
expert-parallel folders, so a legacy checkpoint at EP > 1 is refused by name.
"""

from __future__ import annotations

from nemo_convert.errors import UnsupportedError


class ExpertParallel:
    def check(self, num_experts: int | None, ep: int, *, layout: str = "dist") -> None:
        """Fail, before anything is written, when ``ep`` ranks cannot hold the experts."""
        if ep < 1:
            raise UnsupportedError(f"expert-parallel size must be ≥ 1, got {ep}")
        if ep == 1:
            return
        if not num_experts:
            raise UnsupportedError(f"expert-parallel size {ep} for a model without experts (num_moe_experts unset)")
        if num_experts % ep:
            raise UnsupportedError(f"expert-parallel size {ep} does not divide num_moe_experts={num_experts}")
        if layout != "dist":
            raise UnsupportedError(f"the {layout} layout has no expert-parallel rank folders in NeMo; write EP={ep} "
                                   "with --layout dist (Megatron loads its global experts at any EP)")

    def local_experts(self, num_experts: int, ep: int, rank: int) -> range:
        """The global indices of the experts EP rank ``rank`` holds."""
        self.check(num_experts, ep)
        n = num_experts // ep
        return range(rank * n, (rank + 1) * n)

    def rank_of(self, expert: int, num_experts: int, ep: int) -> int:
        """The EP rank that holds global expert ``expert``."""
        self.check(num_experts, ep)
        return expert // (num_experts // ep)
