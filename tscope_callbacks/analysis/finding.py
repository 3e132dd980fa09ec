"""What an advice rule returns (:class:`Finding`), how its saving was predicted (``PREDICTED_BY``) and what the closed
loop measured for that kind of change (:func:`measured_effect`).

Every finding names a change in the user's code or settings (``fix``) and a predicted saving per step
(``saving_s``), says how the saving was predicted (``predicted_by``, one of ``PREDICTED_BY``, with the figures in
``predicted_text``) and which layer x phase rows the saving comes from (``rows``).

``benchmarks/advice_effect.py`` applies each kind of change to the model it was found on and measures the saving;
it writes the measured / predicted ratio per kind of change and device kind to ``data/advice_effect.json`` (shipped in
the package). :func:`measured_effect` reads it, so a report can say "measured 0.9x the prediction when applied".
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from tscope_callbacks.analysis.fmt import ratio_text, time_text
from tscope_callbacks.analysis.rows import OpRoof

__all__ = ["Finding", "PREDICTED_BY", "rows_of", "effect_key", "measured_effect", "EffectRecord", "ms"]

#: how a finding's saving was predicted (``Finding.predicted_by``) -> what that means, for the report's readers
PREDICTED_BY = {
    "kernel_time": "the changed ops' expected kernel time (the device's measured GEMM tables, or its roof) against "
                   "their measured time",
    "fused_bytes": "the bytes a fused kernel no longer moves, at the rate the unfused ops ran (never faster than the "
                   "bandwidth roof)",
    "elements": "the elements the change skips: the ops' measured time times the share of their elements skipped",
    "layout_rate": "the ops that have a channels-last kernel, at the rate this step's own element-wise ops reach",
    "conversion": "the layout conversions around each convolution: their kernels' measured time, or their bytes at "
                  "the bandwidth roof",
    "removed": "the ops the change removes: their measured time",
    "bytes": "the bytes the change no longer moves, at the bandwidth roof",
    "measured_excess": "the ops' measured time minus what their shapes take on this device",
    "idle": "the device's idle time between kernels in the unprofiled step, less the gaps a CUDA graph keeps",
    "data_wait": "the step monitor's measured fetch of each batch (the DataLoader's next and the transfer)",
    "loop": "the step monitor's measured cost of the loop's own work",
}


def ms(s: float) -> str:
    """A time in a finding's text: the one formatter's (``analysis.fmt.time_text``: "1.23 ms", "875 µs")."""
    return time_text(s)


@dataclass
class Finding:
    """One rule's finding for one layer (or the step)."""

    kind: str
    saving_s: float  #: predicted saving per step
    cause: str  #: why, from the numbers
    fix: str  #: what to change, in the user's terms
    predicted_by: str  #: a key of PREDICTED_BY
    predicted_text: str  #: the prediction's figures, one sentence
    rows: tuple[tuple[str, str], ...] = ()  #: (layer, phase) rows whose time the saving comes from
    evidence: dict[str, Any] = field(default_factory=dict)  #: the figures the finding rests on

    @property
    def chain(self) -> str:
        return str(self.evidence.get("chain", ""))


def rows_of(ops: Iterable[OpRoof]) -> tuple[tuple[str, str], ...]:
    """The (layer, phase) rows of ``ops``, in first-seen order."""
    return tuple(dict.fromkeys((o.record.layer, o.record.phase) for o in ops))


def effect_key(kind: str, chain: str = "") -> str:
    """The closed loop's key for a kind of change: the finding's kind, and for a fusion its chain
    (``fusion:optimizer``)."""
    return f"{kind}:{chain}" if chain else kind


@dataclass(frozen=True)
class EffectRecord:
    """What the closed loop measured for one kind of change on one device kind."""

    ratio: float  #: measured / predicted saving (the median over the models it was applied to)
    text: str  #: "measured 0.92x the prediction (CNN, 1 CPU thread)"


@lru_cache(maxsize=1)
def _effects() -> dict[str, Any]:
    try:
        raw = resources.files("tscope_callbacks.analysis").joinpath("data/advice_effect.json").read_text()
        data = json.loads(raw)
    except (OSError, ValueError):  # an unreadable table: the report shows predictions only
        return {}
    return data if isinstance(data, dict) else {}


def measured_effect(kind: str, chain: str, device_kind: str | None) -> EffectRecord | None:
    """The closed loop's measured / predicted ratio for this kind of change on this kind of device (``"cpu"`` or
    ``"cuda"``); None where it was never measured there. A GPU is never given a CPU's ratio, nor the reverse."""
    dev = "cuda" if str(device_kind or "").startswith("cuda") else "cpu" if device_kind == "cpu" else None
    if dev is None:
        return None
    rows = (_effects().get("effects") or {}).get(dev) or {}
    rec = rows.get(effect_key(kind, chain))
    if not isinstance(rec, dict) or not isinstance(rec.get("ratio"), (int, float)):
        return None
    ratio = float(rec["ratio"])
    cases = [c for c in rec.get("cases") or () if isinstance(c, dict) and isinstance(c.get("ratio"), (int, float))]
    each = "; ".join(f"{c.get('model')}: {ratio_text(float(c['ratio']))}" for c in cases[:4])
    where = each or ", ".join(str(m) for m in rec.get("models") or ())
    text = (f"applied in tscope's closed loop on {'CUDA' if dev == 'cuda' else 'CPU'}, the measured saving was "
            f"{ratio_text(ratio)} the predicted one" + (f" (median; {where})" if len(cases) > 1 else f" ({where})"))
    return EffectRecord(ratio, text)
