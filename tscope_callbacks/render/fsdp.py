"""The FSDP what-if section of the Markdown report (``analysis.fsdp``: ``ReportData.fsdp_whatif``)."""

from __future__ import annotations

from tscope_callbacks.analysis.fmt import bw_text, bytes_text, pct_text, sig, time_text
from tscope_callbacks.analysis.report import ReportData

__all__ = ["fsdp_lines"]


def _mib(x: float | None) -> str:
    """Bytes in MiB (the line says the unit once), "n/a" when unknown."""
    return "n/a" if x is None else sig(x / 2**20)


def _t(x: float | None) -> str:
    return "n/a" if x is None else time_text(x)


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
            line += f": {pct_text(m['share'])} of the device's {bytes_text(m['capacity'])}, **{m['verdict']}**"
    else:
        line += "; peak n/a (profile without layer details: no activation figure)"
    out.append(line)
    ag, rs = c["all_gather"], c["reduce_scatter"]
    coll = (f"- **Collectives per step**: all-gather ×{ag['calls']}, {bytes_text(ag['bytes'])}; reduce-scatter "
            f"×{rs['calls']}, {bytes_text(rs['bytes'])} (nccl-tests' S; each GPU sends and receives S x "
            f"{shard - 1}/{shard})")
    ar = c.get("all_reduce")
    if ar:
        coll += (f"; all-reduce across the {reps} replicas ×{ar['calls']}, {bytes_text(ar['bytes'])} (each GPU's reduced "
                 f"shard; 2 x {reps - 1}/{reps} of it sent)")
    if w.get("link_bandwidth") and t is not None:
        coll += (f"; on {w['link']} at {bw_text(w['link_bandwidth'])} per direction x {w['link_efficiency']:g}"
                 f" (assumed) + {time_text(w['latency_s'])} a call: {_t(ag.get('time_s'))} + "
                 f"{_t(rs.get('time_s'))}")
        if ar:
            coll += (f"; the all-reduce on {w['all_reduce_link']} at {bw_text(w['all_reduce_bandwidth'])}: "
                     f"{_t(ar.get('time_s'))}")
    else:
        coll += "; no interconnect listed for this device: no time"
    out.append(coll)
    if t:
        mfu = f", MFU about {pct_text(t['mfu'])} per GPU" if t.get("mfu") is not None else ""
        ov = f"{pct_text(t['overlap_frac'])} of it overlapped" if t.get("overlap_frac") is not None else "none"
        out.append(f"- **Step** ({t['basis']}): compute {_t(t['compute_s'])} (one GPU: {_t(t['single_step_s'])}"
                   f"; the optimizer updates 1/{shard} of the weights), communication {_t(t['comm_s'])}, {ov}: "
                   f"exposed {_t(t['exposed_s'])}; step about **{_t(t['step_s'])}**{mfu}")
        if t["exposed_s"] > 0.1 * t["step_s"]:
            hsdp = (", or hybrid sharding (`HSDP`: shard within a node, replicate across; `fsdp_shard=` predicts it)"
                    if reps == 1 and w.get("link") == "network" else "")
            out.append("  - exposed communication is over 10% of the step: a larger micro-batch per GPU (more compute "
                       f"to hide each unit's collectives behind), fewer and larger units{hsdp}")
    return out
