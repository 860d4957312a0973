"""TensorRT-LLM checkpoints (``.qnemo``): the reader (the writer is ``nemo_convert/qnemo/``)."""
