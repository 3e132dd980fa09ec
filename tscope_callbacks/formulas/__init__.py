"""FLOP and byte formulas. Importing this package registers every built-in formula family."""

from tscope_callbacks.formulas.registry import DEFAULT_REGISTRY, Formula, FormulaRegistry, op_key, register_flops

__all__ = ["DEFAULT_REGISTRY", "Formula", "FormulaRegistry", "op_key", "register_flops"]
