"""``python -m tscope_callbacks.cli``: the ``tscope`` command."""

import sys

from tscope_callbacks.cli import main

if __name__ == "__main__":
    sys.exit(main())
