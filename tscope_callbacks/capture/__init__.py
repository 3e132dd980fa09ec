"""Capture: the dispatch-mode recorder (``profile``), layer records (``layers``), CUDA kernel timing
(``cuda_timing``), module-path rules (``paths``) and the compile stance (``eager``). No Lightning, no rendering."""
