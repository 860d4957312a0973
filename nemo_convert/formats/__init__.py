"""On-disk formats: one module per format, each with its readers and streaming writers."""
