"""Sharding strategies: how global tensors split across tensor-, pipeline- and
expert-parallel ranks. ``protocol.py`` types the three axes; ``tensor.py``,
``pipeline.py`` and ``expert.py`` are the built-ins, registered by ``builtin.py``."""
