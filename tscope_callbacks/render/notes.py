"""The report's notes on how far its times can be trusted: the step basis (which unprofiled steps, warm-up, the
first profile's wait), the environment (other processes' load, oversubscribed threads, a roof measured under load),
the steps merged, and the rows named as noise (``analysis.noise``)."""

from __future__ import annotations

from tscope_callbacks.analysis.fmt import time_text
from tscope_callbacks.analysis.report import ReportData, RunContext
from tscope_callbacks.devices.calibrate import BUSY_LOAD_PER_CPU

__all__ = ["basis_extra", "environment_lines", "environment_warnings", "noise_lines"]


def basis_extra(c: RunContext, step: int | None) -> str:
    """Which unprofiled steps the basis is, their spread, and whether the first profile waited for them."""
    out = ""
    w = c.step_time_window
    if w:
        out += f": steps {w[0]}-{w[1]}"
        if c.step_time_spread_s is not None:
            out += f", typical deviation {time_text(c.step_time_spread_s)}"
        out += ", past warm-up" if c.step_time_settled else ", warm-up not over (step times still moving)"
    d = c.deferred_from
    if d is not None and d != step:
        out += (f"; the first profile waited from step {d} to step {step} for warmed-up unprofiled steps"
                if c.step_time_settled else
                f"; the first profile waited from step {d} to step {step}, the step time did not settle")
    return out


def environment_warnings(report: ReportData) -> list[tuple[str, str]]:
    """What makes the step's times less trustworthy, as ``(kind, markdown)``: other processes' load over the timed
    steps (``busy``), torch's threads against the CPUs (``oversubscribed``), a roof measured under load
    (``roof-load``), a roof an op beat (``roof-note``) and the rows marked as noise (``noise``). The text report's
    environment lines and the dashboard's banner are made of these."""
    m, out = report.context, []
    if m.host_cpus is not None:
        load = m.host_others_load_per_cpu
        if load is not None and m.host_busy:
            out.append(("busy", f"**busy**: other processes kept {load:.2f} of each of the {m.host_cpus} CPUs busy "
                        "during the timed steps, so times are inflated and noisy (compare runs on an idle machine)"))
        if m.host_oversubscribed:
            cpus, threads, busy = m.host_cpus, m.torch_threads or 0, (load or 0.0) * m.host_cpus
            fewer = max(1, int(cpus - busy))
            fix = (f"`torch.set_num_threads({fewer})`" if fewer < threads
                   else "fewer threads cannot help: a quieter machine or time does")
            out.append(("oversubscribed", f"**oversubscribed**: torch's {threads} thread(s)"
                        + (f" plus {busy:.1f} busy cores" if busy else "")
                        + f" exceed the {cpus} CPUs (threads wait for each other; {fix})"))
    spec_load = report.device.load_per_cpu
    if spec_load is not None and float(spec_load) >= BUSY_LOAD_PER_CPU:
        out.append(("roof-load", f"**Roof measured under load**: other processes kept {float(spec_load):.2f} of each "
                    "CPU busy while the CPU roof was measured: roofs are low and % of roof high (re-measured on the "
                    "next idle run; `tscope calibrate --no-cache` on an idle machine)"))
    out += [("roof-note", f"**Roof note**: {n}") for n in m.roof_notes]
    n = len(report.noise.marks)
    if n:
        out.append(("noise", f"**Noise**: {n} layer×phase row(s) marked as noise (their times disagree across steps "
                    "or with identical blocks): no advice for them"))
    return out


def environment_lines(report: ReportData) -> list[str]:
    """The machine the times were taken on, when it matters: other processes' load over the timed steps, torch's
    threads against the CPUs, and a roof measured under load (``devices.calibrate.host_environment``)."""
    m, out = report.context, []
    warn = dict(environment_warnings(report))
    if m.host_cpus is not None:
        load = m.host_others_load_per_cpu
        parts = []
        if load is None:
            parts.append("other processes' load unknown")
        elif m.host_busy:
            parts.append(warn["busy"])
        else:
            parts.append(f"idle (other processes: {load:.2f} per CPU during the timed steps)")
        parts.append(warn["oversubscribed"] if m.host_oversubscribed
                     else f"torch {m.torch_threads} thread(s) on {m.host_cpus} CPUs")
        out.append("- **Environment**: " + "; ".join(parts))
    if "roof-load" in warn:
        out.append("- " + warn["roof-load"])
    steps = m.merged_steps
    if steps and len(steps) > 1:
        n = len(report.noise.marks)
        out.append(f"- **Times**: each op's time is the median of {len(steps)} profiled steps "
                   f"({', '.join(str(x) for x in steps)}); " + (f"{n} row(s) marked noise (their times disagree "
                                                                 "across steps or with identical blocks): no advice"
                                                                 if n else "no row's times disagree"))
    return out


def noise_lines(report: ReportData, top: int | None = None) -> list[str]:
    """Rows whose time is noise and findings within the measured noise: named, with no advice; at most ``top``
    entries (the slowest noisy rows first), then how many more there are (``report.noise`` holds them all)."""
    noise = report.noise
    marks = list(noise.marks)
    held = list(noise.suppressed)
    if not marks and not held:
        return []
    out = ["", "### Noise (not findings, no advice)", ""]
    for m in sorted(marks, key=lambda m: -m.measured_s):
        out.append(f"- `{m.layer or '(root)'}` {m.phase} — {m.text}")
    for o in held:
        rows = (o.evidence or {}).get("noise_rows")
        if rows:  # its saving rests on rows whose time is noise
            names = ", ".join(f"`{r[0] or '(root)'}` {r[1]}" for r in rows[:3]) + (" ..." if len(rows) > 3 else "")
            out.append(f"- `{o.layer or '(root)'}` {o.title} — predicted saving {time_text(o.saving_s)} rests on "
                       f"rows marked noise ({names}): not a finding")
            continue
        noise_s = o.evidence.get("noise_s") if o.evidence else None
        spread = noise_s if noise_s is not None else noise.spread_of(o.layer, o.phase)
        floor = noise.floor_s
        what = o.title  # the kind ("fusion (loss)"; "forward below expected")
        within = (f"the steps' typical deviation on this busy machine ({time_text(floor)})" if floor >= spread
                  else f"the measured spread of its times over the steps ({time_text(spread)})")
        out.append(f"- `{o.layer or '(root)'}` {what} — predicted saving {time_text(o.saving_s)} is within "
                   f"{within}: not a finding")
    n = len(out) - 3
    if top is not None and n > max(top, 0):
        out = out[:3 + max(top, 0)] + [f"- ... and {n - max(top, 0)} more (a larger `top` lists them; the JSON report "
                                       "holds them all)"]
    return out
