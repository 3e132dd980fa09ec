"""The demo's model (``model``: TinyGPT, no Lightning) and its LightningModule, data and NaN injector
(``lightning``)."""
