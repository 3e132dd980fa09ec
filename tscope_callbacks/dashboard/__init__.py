"""The tscope dashboard: the TSCOPE tab in TensorBoard (``plugin``, registered through the ``tensorboard_plugins``
entry point) and the same page as one self-contained HTML file (``page``); ``logdir`` reads a log dir for both."""
