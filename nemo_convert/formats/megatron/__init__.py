"""Megatron-Bridge and Megatron-LM checkpoint directories, and their model config spellings."""
