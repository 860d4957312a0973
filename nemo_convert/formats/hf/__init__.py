"""Hugging Face model folders: the reader and the streaming safetensors writer; hub ids from the local cache."""
