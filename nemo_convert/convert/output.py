"""The one output step of every conversion: ``--to NAME`` names an output target
(:class:`~nemo_convert.plugins.records.OutputTarget`, registered through the
``nemo_convert_targets`` hook), and ``import``, ``export``, ``reshard``, ``from-ckpt`` and
``quantize`` (``--to trtllm``, the target of :mod:`nemo_convert.qnemo`) all write through it::

    open the source → pick the family → plan        (each conversion's own)
    choose_target + check_output                     (before the source is opened)
    write_output(target, OutputJob(...))             (the target's writer)

No conversion names a target: a target a plugin registers is reached by each of them.
"""

from __future__ import annotations

from nemo_convert.errors import UnsupportedError
from nemo_convert.formats.io.replace import KIND_NAMES
from nemo_convert.formats.io.staging import check_target
from nemo_convert.plugins.manager import Registry
from nemo_convert.plugins.records import OutputJob, OutputTarget, QuantSettings, WriteStats
from nemo_convert.workers import SINGLE, Workers


def choose_target(registry: Registry, to: str, *, layout: str | None = None, workers: Workers = SINGLE,
                  quantization: QuantSettings | None = None) -> OutputTarget:
    """The installed target ``to`` (an unknown name is refused naming the installed ones),
    refusing up front the options it does not take: a ``.nemo`` ``layout``, several
    processes, quantization settings; and a target that quantizes (option
    ``"quantization"``: ``trtllm``) when the conversion has no ``quantization`` to give it
    (only ``quantize`` takes ``--algo`` and the calibration options)."""
    target = registry.target(to)
    if "quantization" in target.options and quantization is None:
        raise UnsupportedError(f"--to {target.name} quantizes ({KIND_NAMES[target.kind]}) and needs --algo, "
                               "--kv-cache and the calibration options, which only quantize takes: run "
                               "nemo-convert quantize SRC -o OUT --algo ALGO")
    if quantization is not None and "quantization" not in target.options:
        raise UnsupportedError(f"--to {target.name} writes {KIND_NAMES[target.kind]}, which is not quantized "
                               f"(drop --algo {quantization.algo})")
    if workers.world > 1 and "workers" not in target.options:
        raise UnsupportedError(f"--to {target.name} is written by one process; run it without torchrun")
    if layout is not None and "layout" not in target.options:
        raise UnsupportedError(f"--layout {layout} is a .nemo layout; --to {target.name} writes "
                               f"{KIND_NAMES[target.kind]}, which has none (drop --layout)")
    return target


def check_output(target: OutputTarget, out: str, *, overwrite: bool, packed: bool = True) -> None:
    """Fail before any work when ``out`` cannot be written as ``target``'s output
    (:func:`~nemo_convert.formats.io.staging.check_target`: a file or a folder as the
    target writes it; ``--overwrite`` replaces only an output of its kind)."""
    check_target(out, overwrite=overwrite, kind=target.kind, is_dir=target.is_dir(packed))


def write_output(target: OutputTarget, job: OutputJob) -> tuple[WriteStats, str]:
    """Write ``job`` with ``target``; returns its stats and the report's ``layout``: the
    ``.nemo`` layout written for a target that takes one, else the target's name."""
    stats = target.write(job)
    if not isinstance(stats, WriteStats):
        raise TypeError(f"output target {target.name!r} returned {type(stats).__name__}, not stats "
                        "(tensors, bytes, seconds, warnings, non_finite)")
    layout = job.layout if "layout" in target.options and job.layout is not None else target.name
    return stats, layout


__all__ = ["check_output", "choose_target", "write_output"]
