"""Megatron-Core ``torch_dist`` checkpoints: the reader, the streaming writer, the ``.metadata`` pickle."""
