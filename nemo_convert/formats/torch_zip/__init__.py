"""The ``torch.save`` zip format: the streaming writer (its reader is ``nemo_convert/tensors/torch_zip.py``)."""
