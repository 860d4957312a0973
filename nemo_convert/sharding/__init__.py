"""Sharding strategies: how global tensors split across tensor/pipeline-parallel ranks."""
