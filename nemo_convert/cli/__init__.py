"""The ``nemo-convert`` command line: one module per command."""
