"""Collectives (op class ``comm``): what each moves, in the nccl-tests convention.

Every c10d collective (``c10d.*``: what ``torch.distributed`` and FSDP2 call) and functional collective
(``_c10d_functional.*``: DTensor, torch.compile) is recorded with :func:`collective_info`:

- ``collective``: all_gather, reduce_scatter, all_reduce, broadcast, all_to_all, send, recv, reduce, gather,
  scatter, barrier, wait;
- ``group`` (process-group name) and ``group_size`` n;
- ``bytes`` S, as nccl-tests count it: the total size (AllGather: the gathered output; ReduceScatter: the
  full input; AllReduce, Broadcast, Reduce, AllToAll, Send/Recv: the buffer);
- ``busbw_factor``: bus bandwidth = S / time x factor (nccl-tests' PERFORMANCE.md): AllReduce 2(n-1)/n,
  AllGather / ReduceScatter / AllToAll (n-1)/n, Broadcast / Reduce / Send / Recv 1. So ``bytes x busbw_factor`` is
  what each rank puts on its link (per direction), the figure placed against the interconnect roof;
- ``async``: launched asynchronously (its time on a CPU host is the launch; NCCL's kernel time on CUDA).

Their FLOPs are 0 (a reduction's additions are negligible and run inside the NCCL kernel) and they move no bytes
of device memory in the roofline's sense (the link is their roof, not HBM). FSDP2's copy-in/out ops
(``fsdp.all_gather_copy_in``, ``split_with_sizes_copy``, ``chunk_cat``) are ``memory`` ops (bytes, no FLOPs).
"""

from __future__ import annotations

from typing import Any

import torch

from tscope_callbacks.formulas.registry import DEFAULT_REGISTRY, Formula

__all__ = ["collective_info", "BUSBW", "COMM_NAMESPACES", "is_comm_op"]

COMM_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional"})

#: busbw factor as a function of the group size n
BUSBW = {
    "all_reduce": lambda n: 2 * (n - 1) / n if n else 0.0,
    "all_gather": lambda n: (n - 1) / n if n else 0.0,
    "reduce_scatter": lambda n: (n - 1) / n if n else 0.0,
    "all_to_all": lambda n: (n - 1) / n if n else 0.0,
    "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send": lambda n: 1.0, "recv": lambda n: 1.0,
    "gather": lambda n: (n - 1) / n if n else 0.0, "scatter": lambda n: (n - 1) / n if n else 0.0,
    "barrier": lambda n: 0.0, "wait": lambda n: 0.0,
}

#: op name -> (collective, where S is read: "out" first tensor(s) / "in" / "all")
_C10D = {
    "_allgather_base_": ("all_gather", 0), "allgather_": ("all_gather", 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0), "allgather_coalesced_": ("all_gather", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1), "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "allreduce_": ("all_reduce", 0), "allreduce_coalesced_": ("all_reduce", 0),
    "broadcast_": ("broadcast", 0), "reduce_": ("reduce", 0), "alltoall_base_": ("all_to_all", 1),
    "alltoall_": ("all_to_all", 1), "send": ("send", 0), "recv_": ("recv", 0), "recv_any_source_": ("recv", 0),
    "gather_": ("gather", 0), "scatter_": ("scatter", 0), "barrier": ("barrier", 0),
}
_FUNCTIONAL = {
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce", "all_to_all_single": "all_to_all", "broadcast": "broadcast",
    "broadcast_": "broadcast", "wait_tensor": "wait",
}
_ZERO = Formula(category="comm", flops=None, zero_bytes=True)
for _name in _C10D:
    DEFAULT_REGISTRY.register(f"c10d.{_name}", _ZERO)
for _name in _FUNCTIONAL:
    DEFAULT_REGISTRY.register(f"_c10d_functional.{_name}", _ZERO)
for _name in ("all_gather_copy_in", "split_with_sizes_copy", "chunk_cat"):
    DEFAULT_REGISTRY.register(f"fsdp.{_name}", Formula(category="memory", flops=None))


def is_comm_op(func: Any) -> bool:
    return getattr(func, "namespace", "") in COMM_NAMESPACES


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        t = x._local_tensor if hasattr(x, "_local_tensor") else x
        return t.numel() * t.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return 0


def _pg(a: Any) -> Any:
    """A ProcessGroup from a dispatcher argument (boxed as a ``torch.ScriptObject`` at the c10d ops)."""
    if isinstance(a, torch.ScriptObject):
        try:
            return torch.distributed.ProcessGroup.unbox(a)
        except Exception:
            return None
    return a


def _group(args: tuple, kwargs: dict) -> tuple[str, int | None]:
    """(name, size) of the process group among the arguments (a ProcessGroup object or a group name)."""
    for a in list(args) + list(kwargs.values()):
        a = _pg(a)
        size = getattr(a, "size", None)
        if callable(size) and hasattr(a, "rank") and not isinstance(a, torch.Tensor):
            try:
                return str(getattr(a, "group_name", "") or ""), int(size())
            except Exception:
                continue
    names = [a for a in args if isinstance(a, str)]
    if names:
        name = names[-1]
        try:
            from torch.distributed.distributed_c10d import _resolve_process_group

            return name, int(_resolve_process_group(name).size())
        except Exception:
            return name, None
    return "", None


def collective_info(func: Any, args: tuple, kwargs: dict | None, out: Any) -> dict[str, Any] | None:
    """What one collective moves (see the module doc); None for ops that are not collectives."""
    ns, name = getattr(func, "namespace", ""), getattr(func, "_opname", "")
    kwargs = kwargs or {}
    if ns == "c10d" and name in _C10D:
        kind, pos = _C10D[name]
        size = _nbytes(args[pos]) if len(args) > pos else 0
        group, n = _group(args, kwargs)
        is_async = next((a for a in args if isinstance(a, bool)), True)
    elif ns in ("_c10d_functional", "c10d_functional") and name in _FUNCTIONAL:
        kind = _FUNCTIONAL[name]
        group, n = _group(args, kwargs)
        ints = [a for a in args[1:] if isinstance(a, int) and not isinstance(a, bool)]
        if kind in ("all_gather", "reduce_scatter") and ints:
            n = n or ints[0]
        size = _nbytes(out) if kind == "all_gather" else _nbytes(args[0]) if args else 0
        if kind == "all_gather" and "out" in kwargs:
            size = _nbytes(kwargs["out"])
        is_async = True
    else:
        return None
    if kind in ("barrier", "wait"):
        size = 0
    factor = BUSBW[kind](n) if n else None
    return {"collective": kind, "group": group, "group_size": n, "bytes": int(size), "busbw_factor": factor,
            "async": bool(is_async)}
