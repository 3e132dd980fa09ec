"""The docs' worked example (docs/reading-the-report.md, "Worked example: GPT-2 124M on an H100") is the output of the
command it names, today."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import tscope_callbacks as ts

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reading-the-report.md"


def _example_findings() -> list[str]:
    text = PAGE.read_text()
    start = text.index("Worked example, HF GPT-2 124M")
    block = text[start:].split("```", 2)[1].split("\n", 1)[1]  # the fenced block after it, without its info string
    items = re.split(r"\n(?=\d+\. )", block.strip())
    return [" ".join(line.strip() for line in item.splitlines()) for item in items]


def test_the_worked_example_is_what_the_analysis_prints() -> None:
    transformers = pytest.importorskip("transformers")
    findings = _example_findings()
    assert len(findings) == 2
    with torch.device("meta"):  # what `tscope analyze hf:gpt2` does on meta
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    rep = ts.analyze_model(model, input_shape=[(8, 1024)], gpu="h100", precision="bf16", backward=True)
    printed = [line.replace("**", "") for line in rep.to_markdown().splitlines() if re.match(r"\d+\. `", line)]
    assert printed[:2] == findings
