"""Markdown (the subset the reports use) to HTML, for backends that show HTML but not markdown (W&B's
``wandb.Html``): headings, bullet and numbered lists, pipe tables, fenced code blocks, paragraphs, ``**bold**``,
``*italic*`` and ```code``` spans. Everything else is escaped text; nothing is fetched, no script is emitted."""

from __future__ import annotations

import html
import re

__all__ = ["markdown_to_html"]

_STYLE = ("<style>.tscope{font-family:system-ui,sans-serif;font-size:13px}.tscope table{border-collapse:collapse}"
          ".tscope td,.tscope th{border:1px solid #ccc;padding:2px 6px;white-space:nowrap}"
          ".tscope td.n{text-align:right}.tscope pre{font-size:12px;overflow-x:auto}</style>")


def _inline(text: str) -> str:
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)
    return re.sub(r"(?<![*\w])\*([^*\s][^*]*)\*(?![*\w])", r"<i>\1</i>", out)


def _cells(line: str) -> list[str]:
    body = line.strip().strip("|")
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", body)]


def _numeric(cell: str) -> bool:
    return bool(re.fullmatch(r"[-+]?[\d,.]+(e[-+]?\d+)?\s*(%|x|ms|MB|GB/s)?", cell))


def markdown_to_html(md: str) -> str:
    """The HTML of ``md`` (a ``<div class="tscope">`` with a small style block)."""
    lines = md.splitlines()
    out: list[str] = [_STYLE, '<div class="tscope">']
    i = 0
    while i < len(lines):
        line = lines[i]
        s = line.strip()
        if s.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            out.append("<pre>" + html.escape("\n".join(lines[i + 1:j]), quote=False) + "</pre>")
            i = j + 1
            continue
        if s.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|?[\s:|-]+\|?", lines[i + 1].strip()):
            head = _cells(s)
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                rows.append(_cells(lines[j]))
                j += 1
            out.append("<table><tr>" + "".join(f"<th>{_inline(h)}</th>" for h in head) + "</tr>")
            for r in rows:
                out.append("<tr>" + "".join(f'<td class="n">{_inline(c)}</td>' if _numeric(c) else
                                            f"<td>{_inline(c)}</td>" for c in r) + "</tr>")
            out.append("</table>")
            i = j
            continue
        m = re.match(r"(#{1,6})\s+(.*)", s)
        if m:
            n = len(m.group(1))
            out.append(f"<h{n}>{_inline(m.group(2))}</h{n}>")
            i += 1
            continue
        if re.match(r"([-*]|\d+\.)\s+", s):
            ordered = bool(re.match(r"\d+\.", s))
            tag = "ol" if ordered else "ul"
            out.append(f"<{tag}>")
            while i < len(lines) and re.match(r"\s*([-*]|\d+\.)\s+", lines[i]):
                out.append("<li>" + _inline(re.sub(r"^\s*([-*]|\d+\.)\s+", "", lines[i])) + "</li>")
                i += 1
            out.append(f"</{tag}>")
            continue
        if s:
            para = [s]
            i += 1
            while i < len(lines) and lines[i].strip() and not re.match(r"\s*(#|\||```|[-*]\s|\d+\.\s)", lines[i]):
                para.append(lines[i].strip())
                i += 1
            out.append("<p>" + _inline(" ".join(para)) + "</p>")
            continue
        i += 1
    out.append("</div>")
    return "\n".join(out)
