"""The FSDP what-if section of the Markdown report (``analysis.fsdp``: ``ReportData.fsdp_whatif``)."""

from __future__ import annotations

from tscope_callbacks.analysis.fmt import n
from tscope_callbacks.analysis.report import ReportData

__all__ = ["fsdp_lines"]


def _mib(x: float | None) -> str:
    return "n/a" if x is None else n(x / 2**20)


def _mb(x: float) -> str:
    return n(x / 1e6)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.4g}"


def fsdp_lines(report: ReportData) -> list[str]:
    """Per-GPU memory, collectives and step time of the step under FSDP over N GPUs; [] without a what-if."""
    w = report.fsdp_whatif
    if not w:
        return []
    n, m, c, t = w["n"], w["memory"], w["comm"], w.get("time")
    shard, reps = w.get("shard_size", n), w.get("replicas", 1)
    dt = (f"parameters gathered in {w['param_dtype']}, gradients reduced in {w['reduce_dtype']}"
          if w.get("param_dtype") else "parameters gathered and gradients reduced at their own dtype")
    title = f"FSDP over {n} GPUs" if reps == 1 else f"HSDP over {n} GPUs ({reps} replicas x {shard}-GPU shards)"
    out = ["", f"### {title} (what-if, per GPU)", "",
           f"FSDP2 `fully_shard` on {w['unit_summary']}"
           + ("" if w.get("reshard_after_forward", True) else ", reshard_after_forward=False")
           + f"; {dt}; the micro-batch per GPU as profiled (the global batch {n}x).", ""]
    opt = "n/a (no optimizer step captured)" if m.get("optimizer_state") is None else _mib(m["optimizer_state"])
    line = (f"- **Memory** (MiB): weights {_mib(m['params'])} · gradients {_mib(m['grads'])} · optimizer state "
            f"{opt} · buffers {_mib(m['buffers'])} · activations and temporaries {_mib(m.get('activations'))} · "
            f"gathered weights {_mib(m['gathered_params'])} · unsharded gradients {_mib(m['unsharded_grads'])}")
    if m.get("peak") is not None:
        line += f"; peak about **{_mib(m['peak'])}** ({m['basis']})"
        if m.get("share") is not None:
            line += f": {m['share']:.1%} of the device's {_mib(m['capacity'])} MiB, **{m['verdict']}**"
    else:
        line += "; peak n/a (profile without layer details: no activation figure)"
    out.append(line)
    ag, rs = c["all_gather"], c["reduce_scatter"]
    coll = (f"- **Collectives per step**: all-gather ×{ag['calls']}, {_mb(ag['bytes'])} MB; reduce-scatter "
            f"×{rs['calls']}, {_mb(rs['bytes'])} MB (nccl-tests' S; each GPU sends and receives S x "
            f"{shard - 1}/{shard})")
    ar = c.get("all_reduce")
    if ar:
        coll += (f"; all-reduce across the {reps} replicas ×{ar['calls']}, {_mb(ar['bytes'])} MB (each GPU's reduced "
                 f"shard; 2 x {reps - 1}/{reps} of it sent)")
    if w.get("link_bandwidth") and t is not None:
        coll += (f"; on {w['link']} at {w['link_bandwidth'] / 1e9:.4g} GB/s per direction x {w['link_efficiency']:g}"
                 f" (assumed) + {w['latency_s'] * 1e6:.3g} µs a call: {_ms(ag.get('time_s'))} + "
                 f"{_ms(rs.get('time_s'))} ms")
        if ar:
            coll += (f"; the all-reduce on {w['all_reduce_link']} at {w['all_reduce_bandwidth'] / 1e9:.4g} GB/s: "
                     f"{_ms(ar.get('time_s'))} ms")
    else:
        coll += "; no interconnect listed for this device: no time"
    out.append(coll)
    if t:
        mfu = f", MFU about {t['mfu']:.1%} per GPU" if t.get("mfu") is not None else ""
        ov = f"{t['overlap_frac']:.0%} of it overlapped" if t.get("overlap_frac") is not None else "none"
        out.append(f"- **Step** ({t['basis']}): compute {_ms(t['compute_s'])} ms (one GPU: {_ms(t['single_step_s'])}"
                   f" ms; the optimizer updates 1/{shard} of the weights), communication {_ms(t['comm_s'])} ms, {ov}: "
                   f"exposed {_ms(t['exposed_s'])} ms; step about **{_ms(t['step_s'])} ms**{mfu}")
        if t["exposed_s"] > 0.1 * t["step_s"]:
            hsdp = (", or hybrid sharding (`HSDP`: shard within a node, replicate across; `fsdp_shard=` predicts it)"
                    if reps == 1 and w.get("link") == "network" else "")
            out.append("  - exposed communication is over 10% of the step: a larger micro-batch per GPU (more compute "
                       f"to hide each unit's collectives behind), fewer and larger units{hsdp}")
    return out
