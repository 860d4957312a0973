"""On-disk formats: one sub-package per format, each with its readers and streaming writers;
the I/O machinery they share (tar containers, staging, output files, sinks) in :mod:`.io`."""
