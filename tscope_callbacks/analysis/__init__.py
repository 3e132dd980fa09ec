"""Analysis: pure functions of records and a ``DeviceSpec``: the roofline, diagnosis and opportunities, layer tables
as data, the throughput/MFU window, non-finite events. Installs no hook or mode (the replay that locates a bad step
is ``capture.locate``); never imports ``render`` or resolves devices."""
