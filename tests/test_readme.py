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


def _readme_lightning_block() -> str:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = text.index("## In a Lightning fit")
    return text[start:].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_fit_profiles_the_steps_its_comment_names() -> None:
    """The comment named steps 10-12 while max_steps=12 ran steps 0-11: the report said "median of 2 profiled steps
    (10, 11)". The steps the comment names are the callback's profile window, inside the fit. The block itself runs
    in tests/test_docs.py."""
    block = _readme_lightning_block()
    named = [int(x) for x in re.search(r"profiles steps ([\d, ]+) \(median", block)[1].split(",")]
    max_steps = int(re.search(r"max_steps=(\d+)", block)[1])
    start = int(re.search(r"RooflineCallback\([^)]*start_step=(\d+)", block)[1])
    cb = ts.RooflineCallback(gpu="h100", start_step=start)
    window = [s for s in range(start, start + cb.capture.steps) if s < max_steps]  # global steps 0..max_steps-1
    assert named == window == [10, 11, 12]
    after = (Path(__file__).resolve().parents[1] / "README.md").read_text().split(block, 1)[1][:600]
    assert "log_every_n_steps" in after and "default 50" in after  # when the automatic MFU is logged
