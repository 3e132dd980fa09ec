"""Analysis: pure functions of records and a ``DeviceSpec``: the roofline, diagnosis and opportunities, layer tables
as data, the throughput/MFU window, non-finite events and locating. Never imports ``render`` or resolves devices."""
