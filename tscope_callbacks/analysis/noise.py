"""Times from several steps, and what in them is noise (DESIGN: "a finding smaller than the measured noise is not a
finding").

- :func:`merge_steps`: k profiles of consecutive steps -> one profile with one time per layer x phase, the median of
  the row's per-step totals (its ops' times in its median step), each op keeping its k times
  (``OpRecord.time_samples``); ops are matched by (op, layer, phase, shapes, occurrence).
- :func:`find_noise`: per layer x phase row, its time in each step (the sum of its ops') and their spread
  (max - min). A row is **noisy** when the spread exceeds ``NOISY_SPREAD`` x its median; a repeated block (same
  pattern ``h.*.mlp``, same ops and shapes) is an **outlier** when it took ``OUTLIER_RATIO`` x what its identical
  siblings took. Both are named as noise and get no advice; an opportunity is shown only when its saving exceeds the
  measured spread of the rows it comes from (``analysis.advice``) and, on a busy machine, the typical deviation of
  the unprofiled steps (``Noise.floor_s``).
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tscope_callbacks.analysis.fmt import pct_text, time_text
from tscope_callbacks.capture.layers import add_op_totals
from tscope_callbacks.records import LayerRecord, OpRecord, StepProfile

if TYPE_CHECKING:
    from tscope_callbacks.analysis.roofline import RooflineAnalysis

__all__ = ["merge_steps", "find_noise", "Noise", "NoiseMark", "NOISY_SPREAD", "OUTLIER_RATIO", "NOISE_FLOOR_SHARE",
           "block_pattern"]

NOISY_SPREAD = 0.5  #: a row whose times over the steps spread (max - min) more than this x their median is noisy
OUTLIER_RATIO = 1.5  #: a block slower than this x the median of its identical siblings is an outlier
NOISE_FLOOR_SHARE = 0.005  #: spreads and excesses below this share of the step are never called noise
_TIME_FIELDS = ("forward_s", "backward_s", "self_forward_s", "self_backward_s", "recompute_s")


def block_pattern(layer: str) -> str:
    """Layer path with its repeated-block indices as ``*`` (``transformer.h.3.mlp`` -> ``transformer.h.*.mlp``)."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", layer) if layer else layer


def _key(r: OpRecord) -> tuple:
    return (r.op, r.layer, r.phase, repr(r.input_shapes))


#: figures of one step's captured region, merged as medians like its wall time
_REGION_FIELDS = ("device_busy_s", "device_idle_s", "outside_ops_s")


def merge_steps(profiles: Sequence[StepProfile]) -> StepProfile:
    """One profile from several of the same step shape (ops matched by op, layer, phase, shapes and occurrence): the
    first one's records and info, with one time per layer x phase, the median of that row's time in each step (the
    sum of its ops' times there). Each op keeps its times in ``time_samples``; its ``time_s`` is its time in the
    row's median step (the mean of the two middle steps for an even count), so the row's ops add up to the row's
    median and every table (layer x phase, op class, op name, totals) sums the same times. Layer records are summed
    again from those op times (self and inclusive, as the capture sums them), so the layer tree shows the same
    figure; the region's wall, busy and idle times are their medians. ``info.merged_steps`` lists the steps."""
    if not profiles:
        raise ValueError("merge_steps needs at least one profile")
    first = profiles[0]
    if len(profiles) == 1:
        return first
    index: list[dict[tuple, float | None]] = []
    for p in profiles:
        seen: dict[tuple, int] = {}
        times: dict[tuple, float | None] = {}
        for r in p.ops:
            k = _key(r)
            n = seen[k] = seen.get(k, -1) + 1
            times[(*k, n)] = r.time_s
        index.append(times)
    ops: list[OpRecord] = []
    per_step: list[list[float | None]] = []  # per op of ``first``: its time in each step (None: not there)
    seen = {}
    for r in first.ops:
        k = _key(r)
        n = seen[k] = seen.get(k, -1) + 1
        per_step.append([times.get((*k, n)) for times in index])
        ops.append(OpRecord.from_dict(r.to_dict()))
    groups: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(ops):
        groups.setdefault((r.layer, r.phase), []).append(i)
    for members in groups.values():
        _median_step_times(ops, per_step, members)
    layers = {path: LayerRecord.from_dict(lr.to_dict()) for path, lr in first.layers.items()}
    for rec in layers.values():
        for f in _TIME_FIELDS:
            setattr(rec, f, 0.0)
    add_op_totals(layers, ops, counts=False)
    walls = [p.wall_time_s for p in profiles if p.wall_time_s is not None]
    # the device's busy and idle time of the captured region, on the same basis as its wall time: the median over the
    # steps (the first step's own were a full capture's, far longer than a replayed step's region)
    region = {k: statistics.median(vals) for k in _REGION_FIELDS
              if (vals := [v for p in profiles if isinstance(v := getattr(p.info, k), (int, float))])}
    info = dataclasses.replace(first.info, **region, merged_steps=[p.info.step for p in profiles],
                               matched_ops=sum(1 for r in ops if r.time_samples and len(r.time_samples) == len(profiles)))
    return StepProfile(ops=ops, layers=layers, wall_time_s=statistics.median(walls) if walls else None, info=info,
                       user=dict(first.user))


def _median_step_times(ops: list[OpRecord], per_step: list[list[float | None]], members: list[int]) -> None:
    """The ops ``members`` of one layer x phase row: each op's samples, and its time in the row's median step (the
    steps ranked by the row's total there, counting the steps where every timed op of the row ran)."""
    k = len(per_step[members[0]])
    for i in members:
        samples = [t for t in per_step[i] if t is not None]
        if samples:
            ops[i].time_samples = samples
    timed = [i for i in members if any(t is not None for t in per_step[i])]
    steps = [j for j in range(k) if all(per_step[i][j] is not None for i in timed)]
    if not timed or not steps:
        for i in timed:  # no step ran all of them: each op's own median
            ops[i].time_s = statistics.median(t for t in per_step[i] if t is not None)
        return
    ranked = sorted(steps, key=lambda j: (sum(per_step[i][j] or 0.0 for i in timed), j))
    mid = len(ranked) // 2
    middle = ranked[mid:mid + 1] if len(ranked) % 2 else ranked[mid - 1:mid + 1]
    for i in timed:
        ops[i].time_s = sum(per_step[i][j] or 0.0 for j in middle) / len(middle)


@dataclass(frozen=True)
class NoiseMark:
    """A row whose time is noise: ``kind`` "spread" (its times over the steps disagree) or "outlier" (slower than
    its identical blocks)."""

    layer: str
    phase: str
    kind: str
    measured_s: float  #: the row's (median) time in the report
    typical_s: float  #: what it should take: its fastest step ("spread") or its identical blocks' median
    spread_s: float  #: max - min of its times over the steps
    samples: tuple[float, ...]  #: its time in each step
    siblings: tuple[str, ...] = ()  #: the identical blocks it was compared with ("outlier")

    @property
    def text(self) -> str:
        ms = time_text  # the one formatter
        steps = ", ".join(ms(t) for t in self.samples)
        if self.kind == "outlier":
            return (f"{ms(self.measured_s)} where its {len(self.siblings)} identical block(s) "
                    f"({', '.join(f'`{s}`' for s in self.siblings[:3])}: same ops, same shapes) take "
                    f"{ms(self.typical_s)}" + (f" (per step: {steps})" if len(self.samples) > 1 else "")
                    + ": noise, not a finding")
        return (f"{ms(self.measured_s)} median over {len(self.samples)} steps ({steps}): spread {ms(self.spread_s)} "
                f"is more than {pct_text(NOISY_SPREAD)} of it: noise, no advice")

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "phase": self.phase, "kind": self.kind, "measured_s": self.measured_s,
                "typical_s": self.typical_s, "spread_s": self.spread_s, "samples": list(self.samples),
                "siblings": list(self.siblings), "text": self.text}


@dataclass
class Noise:
    """The noise of a report: ``steps`` merged, per layer x phase row its spread (seconds, max - min over the steps)
    and the rows marked as noise."""

    steps: int = 1
    spread: dict[tuple[str, str], float] = field(default_factory=dict)
    marks: dict[tuple[str, str], NoiseMark] = field(default_factory=dict)
    #: on a busy machine (``host_busy``), the unprofiled steps' typical deviation: preemptions land on ops at random,
    #: a saving below it cannot be told from them (0 on an idle machine)
    floor_s: float = 0.0

    def layer_noisy(self, layer: str) -> bool:
        return any(k[0] == layer for k in self.marks)

    def layer_outlier(self, layer: str) -> bool:
        return any(k[0] == layer and m.kind == "outlier" for k, m in self.marks.items())

    def layer_spread(self, layer: str, phases: Any = None) -> float:
        """The spread of ``layer``'s times over the steps: its rows' spreads summed (``phases``: those phases')."""
        return sum(v for k, v in self.spread.items() if k[0] == layer and (phases is None or k[1] in phases))

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "floor_s": self.floor_s, "marks": [m.to_dict() for m in self.marks.values()]}


def _samples(ops: list[Any]) -> tuple[float, ...] | None:
    """A row's time in each merged step: per step, the sum of its ops' times (None unless every timed op has the
    same number of samples)."""
    recs = [o.record for o in ops if o.record.time_s is not None]
    if not recs or any(not r.time_samples for r in recs):
        return None
    k = len(recs[0].time_samples)
    if k < 2 or any(len(r.time_samples) != k for r in recs):
        return None
    return tuple(sum(r.time_samples[j] for r in recs) for j in range(k))


def _signature(ops: list[Any]) -> tuple:
    return tuple((o.record.op, repr(o.record.input_shapes)) for o in sorted(ops, key=lambda o: o.record.index))


def find_noise(report: RooflineAnalysis) -> Noise:
    """Noise marks of a roofline analysis (``report.layer_rows``, ``report.measured_step_s``): see module doc."""
    rows = [r for r in report.layer_rows if r.measured_s is not None and r.kind == "layer"]
    step = report.measured_step_s or sum(r.measured_s for r in rows) or 0.0
    floor = NOISE_FLOOR_SHARE * step
    noise = Noise(steps=int(max((len(o.record.time_samples or ()) for o in report.op_roofs), default=1) or 1))
    if report.info.host_busy:
        noise.floor_s = float(report.info.step_time_spread_s or 0.0)
    ops_of = lambda r: report.row_ops.get((r.layer, r.phase), [])  # noqa: E731
    for r in rows:
        s = _samples(ops_of(r))
        if s is None:
            continue
        spread = max(s) - min(s)
        noise.spread[(r.layer, r.phase)] = spread
        if spread > NOISY_SPREAD * statistics.median(s) and spread > floor:
            noise.marks[(r.layer, r.phase)] = NoiseMark(r.layer, r.phase, "spread", r.measured_s, min(s), spread, s)
    groups: dict[tuple, list[Any]] = {}
    for r in rows:
        pat = block_pattern(r.layer)
        if pat != r.layer:
            groups.setdefault((pat, r.phase, _signature(ops_of(r))), []).append(r)
    for members in groups.values():
        if len(members) < 2:
            continue
        for r in members:
            others = [m for m in members if m is not r]
            typical = statistics.median(m.measured_s for m in others)
            if r.measured_s > OUTLIER_RATIO * typical and r.measured_s - typical > floor:
                s = _samples(ops_of(r)) or (r.measured_s,)
                noise.marks[(r.layer, r.phase)] = NoiseMark(r.layer, r.phase, "outlier", r.measured_s, typical,
                                                            max(s) - min(s), s, tuple(m.layer for m in others))
    return noise
