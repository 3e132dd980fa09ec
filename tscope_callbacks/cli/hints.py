"""Commands the CLI prints for the user to run next, spelled so that they work as printed.

A console script (``tensorboard``, ``tscope``) lives in the environment's scripts folder, which is on ``PATH`` only
when that environment is activated. When the bare name would not find this environment's script, the hint names the
script by its full path, or runs the module with this interpreter's full path.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from pathlib import Path

__all__ = ["command"]


def _script(name: str) -> Path | None:
    """This environment's console script ``name``, if it has one."""
    suffix = ".exe" if os.name == "nt" else ""
    folders = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    for folder in folders:
        if folder:
            path = Path(folder) / (name + suffix)
            if path.is_file() and os.access(path, os.X_OK):
                return path
    return None


def command(name: str, module: str) -> str:
    """``name`` when ``PATH`` finds this environment's script; else its full path; else ``python -m module``."""
    script = _script(name)
    if script is None:
        return f"{shlex.quote(sys.executable)} -m {module}"
    found = shutil.which(name)
    try:
        if found and os.path.samefile(found, script):
            return name
    except OSError:
        pass
    return shlex.quote(str(script))
