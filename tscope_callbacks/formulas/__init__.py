"""FLOP and byte formulas. Importing this package registers every built-in formula family into
``DEFAULT_REGISTRY``; ``count_op`` is the one entry point the capture engine calls per op."""

from tscope_callbacks.formulas import (  # noqa: F401  (imported for their registrations)
    attention,
    comm,
    composite,
    conv,
    embedding,
    losses,
    matmul,
    memory,
    norm,
    optimizer,
    pointwise,
    pooling,
    reductions,
    rnn,
    views,
)
from tscope_callbacks.formulas.apply import OpCount, clear_formula_errors, count_op, formula_errors
from tscope_callbacks.formulas.bytes import generic_bytes
from tscope_callbacks.formulas.registry import DEFAULT_REGISTRY, Formula, FormulaRegistry, op_key, register_flops

__all__ = [
    "DEFAULT_REGISTRY",
    "Formula",
    "FormulaRegistry",
    "OpCount",
    "clear_formula_errors",
    "count_op",
    "formula_errors",
    "generic_bytes",
    "op_key",
    "register_flops",
]
