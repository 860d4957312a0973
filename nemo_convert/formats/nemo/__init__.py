"""NeMo 1 ``.nemo`` checkpoints: the reader (any layout), the weights writers, the per-rank layout."""
