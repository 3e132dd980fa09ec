"""The torchprof-style tree table of layer records (text)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tscope_callbacks.analysis.fmt import bytes_text, sig, time_text
from tscope_callbacks.analysis.layers import layer_children
from tscope_callbacks.records import LayerRecord

__all__ = ["render_tree_table", "render_tree_markdown", "ROOT_NAME"]

ROOT_NAME = "(root)"  #: the root layer's name on every surface (the reports' rows, the page's tree, these tables)


def _time(seconds: float) -> str:
    """``analysis.fmt.time_text`` (the one formatter's: "1.67 ms", "312 µs")."""
    return time_text(max(seconds, 0.0))


def _mib(b: int | float) -> str:
    """Bytes in a column headed "MiB" (binary units, the one convention for bytes)."""
    return sig(b / 2**20)


def _gflops(f: int | float) -> str:
    return sig(f / 1e9)


_COLUMNS = ("Module", "Self fwd", "fwd total", "Self bwd", "bwd total", "GFLOPs fwd", "GFLOPs bwd",
            "output MiB", "mem fwd MiB", "mem bwd MiB", "calls")


def _tree_order(layers: Mapping[str, LayerRecord], root_name: str) -> list[tuple[str, str]]:
    """(label with tree prefix, path) in pre-order; labels drawn with ``├──``, ``└──`` and ``│``."""
    kids = layer_children(layers)
    out: list[tuple[str, str]] = []
    if "" not in layers:
        return [(p, p) for p in layers]

    def walk(path: str, prefix: str) -> None:
        ch = kids.get(path, [])
        for i, c in enumerate(ch):
            last = i == len(ch) - 1
            name = c[len(path) + 1 :] if path else c
            out.append((prefix + ("└── " if last else "├── ") + name, c))
            walk(c, prefix + ("    " if last else "│   "))

    out.append((root_name, ""))
    walk("", "")
    return out


def render_tree_table(
    layers: Mapping[str, LayerRecord], *, root_name: str | None = None, title: str | None = None
) -> str:
    """torchprof-style table: one row per layer, the module tree drawn in the first column.

    Columns: Module | Self fwd | fwd total | Self bwd | bwd total | GFLOPs fwd | GFLOPs bwd | output MiB |
    mem fwd MiB | mem bwd MiB | calls. Times are op times (self = the layer's own ops, total = with children).
    """
    rows = _rows(layers, root_name)
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(_COLUMNS)]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [title] if title else []
    out.append(line(_COLUMNS))
    out.append("-|-".join("-" * w for w in widths))
    out.extend(line(r) for r in rows)
    return "\n".join(out)


_MD_COLUMNS = ("Module", "self fwd", "fwd", "self bwd", "bwd", "GFLOP", "mem fwd", "mem bwd", "calls")


def _short_time(seconds: float) -> str:
    """``"15.5\u00a0ms"``: ``analysis.fmt.time_text`` (the page's), the unit joined by a non-breaking space."""
    return time_text(max(seconds, 0.0)).replace(" ", "\u00a0")


def _short_bytes(b: int | float | None) -> str:
    """``"32\u00a0KiB"``: ``analysis.fmt.bytes_text`` (the page's), the unit joined by a non-breaking space."""
    return bytes_text(b).replace(" ", "\u00a0")


def render_tree_markdown(layers: Mapping[str, LayerRecord], *, root_name: str | None = None,
                         title: str | None = None) -> str:
    """The tree table as markdown, for TensorBoard's Text tab and W&B: a real table (it wraps instead of being cut
    off on the right), the tree indented with non-breaking spaces, times and sizes right-aligned. TensorBoard breaks
    a word anywhere once a table is wider than its card, so this one is narrow: short headers, 3-digit times and
    sizes with their unit joined by a non-breaking space (the page's units: ``analysis.fmt``), FLOPs forward +
    backward in one column, no output size
    (the text table of :func:`render_tree_table` and the CSV rows have every column)."""
    out = [f"**{title}**", ""] if title else []
    out.append("| " + " | ".join(_MD_COLUMNS) + " |")
    out.append("|:--|" + "|".join("--:" for _ in _MD_COLUMNS[1:]) + "|")
    name = root_name or (layers[""].type if "" in layers and layers[""].type else "model")
    for label, path in _tree_order(layers, name):
        L = layers[path]
        stripped = label.lstrip("│ ├└─")
        depth = (len(label) - len(stripped)) // 4
        cells = ["&nbsp;" * (2 * depth) + f"`{stripped}`", _short_time(L.self_forward_s), _short_time(L.forward_s),
                 _short_time(L.self_backward_s), _short_time(L.backward_s), sig((L.flops_fwd + L.flops_bwd) / 1e9),
                 _short_bytes(L.memory_fwd_bytes), _short_bytes(L.memory_bwd_bytes), str(L.calls)]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _rows(layers: Mapping[str, LayerRecord], root_name: str | None) -> list[tuple[str, ...]]:
    root = layers.get("")
    name = root_name or (root.type if root is not None and root.type else "model")
    rows = []
    for label, path in _tree_order(layers, name):
        L = layers[path]
        rows.append((
            label,
            _time(L.self_forward_s),
            _time(L.forward_s),
            _time(L.self_backward_s),
            _time(L.backward_s),
            _gflops(L.flops_fwd),
            _gflops(L.flops_bwd),
            _mib(L.output_bytes),
            _mib(L.memory_fwd_bytes),
            _mib(L.memory_bwd_bytes),
            str(L.calls),
        ))
    return rows
