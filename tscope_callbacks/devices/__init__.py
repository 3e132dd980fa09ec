"""Device roofs: precision rules (``precision``), ``DeviceSpec`` and the row schema (``spec``), the ``gpu_specs.json``
table and name resolution (``table``), measured roofs (``calibrate``, ``cache``) and ``get_device_spec``
(``resolve``). Nothing here imports the other layers of the package."""
