"""One spelling for the device a user names: ``gpu=`` (a name, alias, JSON path, ``torch.device``, ``"auto"`` or a
``DeviceSpec``; on a machine without CUDA ``"auto"`` names the CPU). Older spellings (``spec=``, ``device=``) stay
for one version as deprecated aliases. ``device=`` keeps its own meaning where it is the torch device a model runs on
(``analyze_model(device="meta")``, ``tscope analyze --device``)."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["UNSET", "gpu_alias"]


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  #: the default of a deprecated alias: not passed


def gpu_alias(gpu: Any, old: Any, *, old_name: str, func: str, default: Any = None) -> Any:
    """The device named by ``gpu=``, or by its deprecated alias ``old_name=`` (warned about once per call site, naming
    ``gpu=``). Both given: a one-line TypeError."""
    if old is UNSET:
        return gpu
    warnings.warn(f"{func}({old_name}=...) is deprecated and will be removed in the next version: pass gpu=... "
                  "instead", DeprecationWarning, stacklevel=3)
    if gpu is not default and gpu is not old:
        raise TypeError(f"{func}: name the device once, as gpu= ({old_name}= is its deprecated spelling)")
    return old
