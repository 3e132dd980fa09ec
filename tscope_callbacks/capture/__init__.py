"""Capture: everything that installs hooks or a dispatch mode. The recorder (``profile``: the public ``Profile``;
``state``: what a region gathers and the per-op hot path; ``region``: what it installs and its dispatch mode;
``build``: the result at stop), phase and layer rules (``attribute``), compiled kernels (``compiled``), layer records
(``layers``), CUDA kernel timing (``cuda_timing``), replays of a timed step (``replay``), module-path rules
(``paths``), the compile stance (``eager``), the replay that locates a non-finite step (``locate``) and its op-origin
mode (``op_origin``), and the calibration kernel timers (``kernel_timers``). No Lightning, no rendering."""
