"""Markdown to HTML for W&B: the report's tables, lists and code blocks render, nothing unescaped gets through."""

from __future__ import annotations

from profiles import a100, toy_profile

import tscope_callbacks as ts
from tscope_callbacks.render.html import markdown_to_html


def test_report_markdown_renders_as_html():
    md = ts.roofline(toy_profile(), a100()).to_markdown()
    out = markdown_to_html(md)
    assert out.count("<table>") == 2 and "<th>layer</th>" in out and '<td class="n">' in out
    assert "<h2>Roofline" in out and "<ul>" in out and "<b>MFU</b>" in out
    assert "<ol>" in markdown_to_html("1. a finding\n2. another")  # the opportunities' numbered list
    assert "<code>blocks.0.fc</code>" in out and "|" not in out.split("</style>")[1].replace("\\|", "")


def test_code_blocks_and_escaping():
    out = markdown_to_html("```\n<tree> & a\n  b\n```\n<script>alert(1)</script> **x**")
    assert "<pre>&lt;tree&gt; &amp; a\n  b</pre>" in out
    assert "<script>" not in out and "&lt;script&gt;" in out and "<b>x</b>" in out
