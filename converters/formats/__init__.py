"""The checkpoint formats: one module or package per format, each declaring ``FORMAT``
(``converters/descriptor.py``) and listed once in ``converters/registry.py``.

A format holds its name table (how its tensors are spelled against the canonical names), its reader
and writer, and its descriptor. Byte-level parsing is in ``converters/containers/``.
"""
