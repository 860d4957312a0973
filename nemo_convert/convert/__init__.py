"""The conversions, one module each; :mod:`nemo_convert.api` is their public face."""
