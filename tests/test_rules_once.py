"""Each counting rule is written once (DESIGN.md "Data flow"): model FLOPs (``records.model_flops``), per-element
costs (``formulas.costs``), the byte rule (``formulas.bytes.split_io``), GEMM FLOPs (``devices.gemm.gemm_flops``)
and the union of intervals (``formulas.intervals``). These checks read the package's source and fail where a second
copy of a rule's telltale comes back, naming the file and line."""

from __future__ import annotations

import ast
from pathlib import Path

import tscope_callbacks
from tscope_callbacks.formulas.costs import DROPOUT_COSTS, POINTWISE_COSTS, REDUCTION_COSTS

PKG = Path(tscope_callbacks.__file__).parent


def _modules() -> list[tuple[str, ast.AST]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        out.append((rel, ast.parse(path.read_text(), filename=rel)))
    assert len(out) > 50
    return out


def _where(rel: str, node: ast.AST) -> str:
    return f"{rel}:{getattr(node, 'lineno', '?')}"


def test_model_flops_phases_are_read_by_the_one_definition_only() -> None:
    # a module that filters phases for model FLOPs is a second definition: it should call records.model_flops
    hits = [_where(rel, n) for rel, tree in _modules() for n in ast.walk(tree)
            if isinstance(n, ast.Name) and n.id == "NON_MODEL_PHASES" and rel != "records.py"]
    assert hits == [], f"NON_MODEL_PHASES used outside records.model_flops: {hits}"


def test_per_element_costs_live_in_one_table() -> None:
    # a dict of op names to FLOP counts outside formulas/costs.py is a second cost table
    tabled = set(POINTWISE_COSTS) | set(REDUCTION_COSTS) | set(DROPOUT_COSTS) | {"gelu", "gelu_backward"}
    hits = []
    for rel, tree in _modules():
        if rel == "formulas/costs.py" or rel.startswith("devices/"):  # devices' tables are bytes and times
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.Dict):
                costed = [k.value for k, v in zip(n.keys, n.values)
                          if isinstance(k, ast.Constant) and k.value in tabled
                          and isinstance(v, ast.Constant) and isinstance(v.value, int) and not isinstance(v.value, bool)]
                if costed:
                    hits.append(f"{_where(rel, n)} {costed}")
    assert hits == [], f"per-element costs outside formulas/costs.py: {hits}"


def test_the_byte_rule_reads_the_schema_plan_in_one_place() -> None:
    # which arguments an op reads and writes (the schema plan's mutated and out= arguments) is decided by split_io
    hits = [_where(rel, n) for rel, tree in _modules() for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr in ("pos_write", "kw_write")
            and rel != "formulas/bytes.py"]
    assert hits == [], f"the generic byte rule's argument split outside formulas.bytes: {hits}"


def _mul_names(node: ast.AST) -> tuple[set[str], bool]:
    """Names (``n**3`` read as m, n, k) and whether the constant 2 appear in a chain of multiplications."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        a, two_a = _mul_names(node.left)
        b, two_b = _mul_names(node.right)
        return a | b, two_a or two_b
    if isinstance(node, ast.Name):
        return {node.id}, False
    if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and isinstance(node.right, ast.Constant)
            and node.right.value == 3):
        return {"m", "n", "k"}, False
    return set(), isinstance(node, ast.Constant) and node.value == 2


def test_gemm_flops_are_written_once() -> None:
    hits = []
    for rel, tree in _modules():
        for n in ast.walk(tree):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult):
                names, two = _mul_names(n)
                if two and {"m", "n", "k"} <= names and rel != "devices/gemm.py":
                    hits.append(_where(rel, n))
    assert hits == [], f"2 m n k outside devices.gemm.gemm_flops: {hits}"


def test_the_union_of_intervals_is_written_once() -> None:
    # the merge loop: ``for s, e in sorted(...)`` over (start, end) pairs
    hits = []
    for rel, tree in _modules():
        for n in ast.walk(tree):
            if (isinstance(n, ast.For) and isinstance(n.target, ast.Tuple) and len(n.target.elts) == 2
                    and isinstance(n.iter, ast.Call) and getattr(n.iter.func, "id", None) == "sorted"
                    and rel != "formulas/intervals.py"):
                hits.append(_where(rel, n))
    assert hits == [], f"an interval union outside formulas.intervals: {hits}"


def test_step_files_are_read_by_one_reader_with_one_error_class() -> None:
    # the CLI, the report loader and the dashboard read a saved step file through analysis.report.read_step_json and
    # raise its StepFileError: a second class of that name, or a second JSON parse of a step file, is a second reader
    classes = [_where(rel, n) for rel, tree in _modules() for n in ast.walk(tree)
               if isinstance(n, ast.ClassDef) and n.name == "StepFileError"]
    assert classes == ["analysis/report.py:" + classes[0].split(":")[1]] and len(classes) == 1, classes
    readers = ("analysis/report.py", "cli/report.py", "cli/diff.py", "api.py", "dashboard/logdir.py",
               "dashboard/interim.py", "dashboard/page.py")
    parses = [_where(rel, n) for rel, tree in _modules() if rel in readers for n in ast.walk(tree)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("load", "loads")
              and isinstance(n.func.value, ast.Name) and n.func.value.id == "json"]
    assert [p for p in parses if not p.startswith("analysis/report.py:")] == [], parses
