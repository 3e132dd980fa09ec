"""``get_device_spec``: a name, alias, JSON path, ``torch.device`` or ``"auto"`` -> :class:`DeviceSpec`.

The one place where resolving a device may measure something (``"auto"`` on a machine without CUDA measures the
CPU roof, cached per machine); analysis never resolves: its callers pass a ``DeviceSpec``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from typing import Any

import torch

from tscope_callbacks.devices import table as spec_table
from tscope_callbacks.devices.spec import DeviceSpec

__all__ = ["get_device_spec", "list_specs"]


def _looks_like_path(s: str) -> bool:
    return s.lower().endswith(".json") or (os.sep in s and os.path.isfile(s))


def get_device_spec(gpu: str | os.PathLike[str] | DeviceSpec | torch.device | None = "auto", *,
                    table: str | os.PathLike[str] | None = None, cache: bool = True,
                    budget_s: float | None = None) -> DeviceSpec:
    """Resolve ``gpu`` to a :class:`DeviceSpec`.

    ``gpu``: ``"auto"`` (the current CUDA/ROCm device's name through the table; on a machine without CUDA a
    measured CPU roof, cached per machine under ``$TSCOPE_CACHE_DIR`` or ``~/.cache/tscope``), ``"cpu"`` (that
    measured CPU roof on any machine), a canonical name,
    a real ``torch.cuda.get_device_name()`` string, an alias ("h100", "a100-80gb", "4090"), a path to a JSON file
    (one row object, or a list holding one row), a ``torch.device``, or a ``DeviceSpec`` (returned as is).
    Matching is case-insensitive: exact names first, then aliases, then the rows' regex patterns; a name fitting
    several rows raises :class:`AmbiguousDeviceError`, an unknown one :class:`UnknownDeviceError`.

    ``table``: an extra JSON table searched before the built-in one. ``cache`` / ``budget_s``: CPU measurement
    cache use and time budget in seconds (default 2.5).
    """
    device = gpu
    if isinstance(device, DeviceSpec):
        return device
    if device is None:
        device = "auto"
    if isinstance(device, torch.device):
        if device.type == "cuda":
            idx = device.index if device.index is not None else torch.cuda.current_device()
            return _cuda_spec(idx, table=table)
        if device.type == "cpu":
            return _cpu_spec(cache=cache, budget_s=budget_s)
        raise ValueError(f"get_device_spec: no roofs for device type {device.type!r}; pass a name or DeviceSpec")
    if isinstance(device, os.PathLike) or (isinstance(device, str) and _looks_like_path(device)):
        return spec_table.spec_from_file(device)
    if not isinstance(device, str):
        raise TypeError(f"get_device_spec expects a name, a JSON path, a DeviceSpec or 'auto', got {type(device).__name__}")
    if device.strip().lower() == "cpu":  # the string a user writes for torch.device("cpu")
        return _cpu_spec(cache=cache, budget_s=budget_s)
    if device.strip().lower() == "auto":
        if torch.cuda.is_available():
            return _cuda_spec(torch.cuda.current_device(), table=table)
        return _cpu_spec(cache=cache, budget_s=budget_s)
    try:
        return spec_table.resolve(device, extra_table=table)
    except spec_table.UnknownDeviceError:
        hit = _common_spelling(device, table)
        if hit is None:
            raise
        return hit


#: memory sizes (GB) a bare number after a model stands for ("h100-sxm5-80" = "h100-sxm5-80gb")
_MEMORY_GB = frozenset({"12", "16", "24", "32", "40", "48", "80", "94", "96", "141", "144", "192", "256", "288"})
_VENDOR = frozenset({"nvidia", "tesla", "amd", "instinct"})
_MEMORY_KIND = frozenset({"hbm2", "hbm2e", "hbm3", "hbm3e"})


def _common_spelling(name: str, table: Any) -> DeviceSpec | None:
    """The row a common spelling of a device names, when the table's names, aliases and patterns miss it: the
    vendor and memory kind left out, a bare memory size read as GB ("80" -> "80gb", "80 gb" -> "80gb"), the words in
    any order ("h100 80gb sxm" = "h100-sxm-80gb"); "sxm5"/"sxm4" also tried as "sxm". At least the model and one more
    word; None unless exactly one row fits (never a guess between rows)."""
    words = spec_table.norm_key(name).split()
    toks: list[str] = []
    for w in words:
        if w == "gb" and toks and toks[-1].endswith("gb"):
            continue
        if w in _VENDOR or w in _MEMORY_KIND:
            continue
        toks.append(f"{w}gb" if w in _MEMORY_GB and toks else w)
    if not 2 <= len(toks) <= 5:  # a bare model ("NVIDIA H100": which H100?) stays unknown, as the table has it
        return None
    variants = {tuple(toks), tuple("sxm" if re.fullmatch(r"sxm\d", t) else t for t in toks)}
    tables = ([spec_table.load_table(table)] if table is not None else []) + [spec_table.builtin_table()]
    hits: dict[str, DeviceSpec] = {}
    for v in variants:
        for perm in itertools.permutations(v):
            for t in tables:
                try:
                    spec = t.lookup(" ".join(perm))
                except spec_table.AmbiguousDeviceError:
                    return None
                if spec is not None:
                    hits[spec.name] = spec
                    break
    return next(iter(hits.values())) if len(hits) == 1 else None


def _cuda_spec(index: int, *, table: Any) -> DeviceSpec:
    name = torch.cuda.get_device_name(index)
    hint = (f"{name!r} is the current GPU (cuda:{index}); `tscope calibrate` measures its achievable roofs, "
            "but roofline reports need a datasheet row.")
    spec = spec_table.resolve(name, extra_table=table, hint=hint)
    try:  # this GPU's own memory, not the row's (a row may stand for several capacities)
        spec = dataclasses.replace(spec, memory_bytes=int(torch.cuda.get_device_properties(index).total_memory))
    except Exception:
        pass
    try:
        from tscope_callbacks.devices.calibrate import cached_achievable

        ach = cached_achievable(name)
    except Exception:  # a broken cache never breaks name resolution
        ach = None
    return spec.with_achievable(ach) if ach is not None else spec


def _cpu_spec(*, cache: bool, budget_s: float | None) -> DeviceSpec:
    from tscope_callbacks.devices.calibrate import DEFAULT_CPU_BUDGET_S, cpu_spec

    spec = cpu_spec(cache=cache, budget_s=DEFAULT_CPU_BUDGET_S if budget_s is None else budget_s)
    try:  # the host's memory: what a CPU step's memory is compared with
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return dataclasses.replace(spec, memory_bytes=int(ram)) if ram > 0 else spec
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
        return spec


def list_specs(*, table: str | os.PathLike[str] | None = None) -> list[DeviceSpec]:
    """All rows of the built-in table (after the rows of ``table``, when given), in file order."""
    return spec_table.all_specs(extra_table=table)
