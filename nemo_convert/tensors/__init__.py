"""Lazy tensor sources: nothing here reads tensor bytes until asked."""

from nemo_convert.tensors.base import ByteRegion, TensorInfo, TensorSource

__all__ = ["ByteRegion", "TensorInfo", "TensorSource"]
