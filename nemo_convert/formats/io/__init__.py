"""The I/O machinery every format writer and reader uses: sinks, atomic staging, output files, tar containers."""
