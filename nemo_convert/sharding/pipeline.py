"""Pipeline parallelism: which layers live on which stage, and how names are renumbered.

Layers split evenly (or by an explicit list of stage sizes), layer indices restart at 0 in
each stage, the embedding lives on the first stage, the final norm and output layer on
the last; a tied embedding is duplicated on the last stage.
"""

from __future__ import annotations

from typing import Sequence

from nemo_convert.errors import UnsupportedError


class PipelineParallel:
    def stage_layers(self, num_layers: int, pp: int, sizes: Sequence[int] | None = None) -> list[range]:
        """The global layer range of each stage."""
        if pp < 1:
            raise UnsupportedError(f"pipeline size must be ≥ 1, got {pp}")
        if num_layers == 0 and pp > 1:  # CLIP: two towers, no decoder-layer stack (NeMo has no PP for it)
            raise UnsupportedError(f"this model family has no pipeline-parallel layout (no decoder layers to "
                                   f"split into stages); it is written at PP=1 only, not {pp}")
        if sizes is not None:
            if len(sizes) != pp:
                raise UnsupportedError(f"stage sizes {list(sizes)} name {len(sizes)} pipeline stage(s) but the "
                                       f"pipeline size is {pp}: pass --pp {len(sizes)} (pp={len(sizes)}) with them")
            if sum(sizes) != num_layers or any(s < 1 for s in sizes):
                raise UnsupportedError(f"stage sizes {list(sizes)} do not split {num_layers} layers into {pp} stages "
                                       f"(they must add up to {num_layers}, each at least 1)")
        else:
            if pp > max(num_layers, 1):
                raise UnsupportedError(f"pipeline size {pp} is larger than the number of layers ({num_layers})")
            if num_layers % pp:
                raise UnsupportedError(f"{num_layers} layers do not split evenly into {pp} pipeline stages; "
                                       "give explicit stage sizes")
            sizes = [num_layers // pp] * pp
        out, start = [], 0
        for s in sizes:
            out.append(range(start, start + s))
            start += s
        return out
