"""Compatibility with other tools' APIs: fvcore/Tensorscope element counting (``elemcount``)."""
