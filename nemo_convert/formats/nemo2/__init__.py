"""NeMo 2.0 checkpoint folders."""
