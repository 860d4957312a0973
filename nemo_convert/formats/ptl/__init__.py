"""PyTorch Lightning training checkpoints: finding and reading them."""
