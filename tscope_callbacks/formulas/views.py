"""View and metadata ops: category "view", known zero FLOPs and zero bytes.

Besides the explicit list, ``view_fallback`` classifies any op whose schema returns only non-writing aliases of
its inputs (``Tensor(a)``: view, t, expand, split, unbind, detach...) as a view, so unknown view ops are known-zero
rather than uncounted; ``profiler::*`` bookkeeping ops are zero as well. Allocations without initialisation
(``empty*``, ``new_empty*``) move no bytes either.
"""

from __future__ import annotations

from typing import Any

from tscope_callbacks.formulas.common import reg
from tscope_callbacks.formulas.registry import DEFAULT_REGISTRY, Formula

__all__ = ["VIEW", "view_fallback"]

VIEW = Formula(category="view", flops=None, zero_bytes=True)

reg(
    [
        # views (most are also caught by the alias fallback; listed so the table documents them)
        "view", "_unsafe_view", "_reshape_alias", "t", "transpose", "permute", "expand", "expand_as",
        "as_strided", "slice", "select", "unsqueeze", "squeeze", "detach", "alias", "split", "split_with_sizes",
        "unbind", "chunk", "tensor_split", "unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk", "narrow", "diagonal", "unfold", "movedim", "view_as_real",
        "view_as_complex", "_conj", "_neg_view", "real", "imag", "lift_fresh", "lift", "_nested_view_from_buffer",
        # in-place metadata changes
        "t_", "transpose_", "squeeze_", "unsqueeze_", "as_strided_", "detach_", "resize_", "resize_as_",
        "_resize_output_", "swapdims_", "swapaxes_", "set_",
        # allocation without initialisation
        "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "empty_permuted",
        # metadata queries and bookkeeping
        "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type",
        "_assert_async", "_assert_scalar", "_functional_assert_async", "_functional_assert_scalar",
        "sym_constrain_range", "sym_constrain_range_for_size", "_print", "record_stream", "_version",
        "is_pinned",
    ],
    "view",
    None,
    zero_bytes=True,
)


def view_fallback(func: Any) -> Formula | None:
    """Ops that only return non-writing aliases of inputs, and ``profiler::*`` ops: known zero."""
    if getattr(func, "namespace", None) == "profiler":
        return VIEW
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.returns:
        return None
    for r in schema.returns:
        ai = r.alias_info
        if ai is None or ai.is_write:
            return None
    return VIEW


DEFAULT_REGISTRY.add_fallback(view_fallback)
