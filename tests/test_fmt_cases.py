"""The Python formatter prints what the page prints: the shared cases of tests/js/format_cases.json (the page's
JavaScript passes the same in tests/js/fmt.test.js)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tscope_callbacks.analysis import fmt

CASES = json.loads((Path(__file__).parent / "js" / "format_cases.json").read_text(encoding="utf-8"))["cases"]
FN = {"sig": fmt.sig, "time": fmt.time_text, "ms": fmt.ms_text, "pct": fmt.pct_text, "ratio": fmt.ratio_text,
      "bytes": fmt.bytes_text, "flops": fmt.flops_text, "rate": fmt.rate_text, "bw": fmt.bw_text,
      "count": fmt.count_text, "figure": fmt.figure_text}


@pytest.mark.parametrize("fn,args,want", CASES, ids=[f"{c[0]}{c[1]}" for c in CASES])
def test_shared_format_case(fn, args, want):
    assert FN[fn](*args) == want


def test_no_exponent_and_no_nan_ever():
    for x in (1e-20, 6.939e-15, 1.5e-7, 1e21, 123456789012.0, -3e-9, float("nan"), float("inf"), None):
        for f in (fmt.sig, fmt.ms_text, fmt.time_text, fmt.pct_text, fmt.bytes_text, fmt.rate_text, fmt.bw_text):
            t = f(x)
            assert "e+" not in t and "e-" not in t and "nan" not in t.lower() and "inf" not in t.lower(), (f, x, t)
