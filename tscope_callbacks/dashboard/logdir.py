"""Reading a log dir for the dashboard: the runs, their profiled steps, one step's report, a run's series.

Shared by the TensorBoard plugin (``dashboard/plugin.py``) and the standalone page (``tscope view``, ``to_html``).
Nothing here raises for bad input: a file that cannot be read is listed with its error, and the rest is shown.

- ``scan(logdir) -> {"runs": [{"run", "dir", "steps": [{"step", "stage", "readable", "error", "details"}], "open"}],
  "hint"}``:
  every directory under ``logdir`` holding ``tscope/step_<N>.json`` or ``tscope/<stage>_step_<N>.json`` is a run,
  named as TensorBoard names it (its path relative to ``logdir``; ``"."`` for ``logdir`` itself). The files are
  listed again on every call, so a run still being written shows its new steps; a file is parsed again only when
  its (path, mtime, size) changed. ``details``: the step has layer details; ``open``: the step the page opens the run
  on (``render.dashboard.open_step``), ``"<stage>:<step>"`` or None. ``hint`` says how to add the callback when no
  run holds tscope data.
- ``load(run_dir, step, stage="train") -> dict``: the step's StepReport dict (the contract of
  ``StepReport.to_dict()``, schema ``"tscope.step_report"``, ``analysis.report.VERSION``), or ``{"error": "<one
  line>"}`` for a missing, corrupt, half-written or other-version file (the message names the version found).
- ``series(run_dir) -> {"mfu": [[step, value], ...], "step_ms": ..., "tokens_per_s": ..., ...,
  "step/fetch_ms": ..., "gpu/power_w": ..., "alerts": [[step, text], ...],
  "ranks": {"step_ms": {"<rank>": [[step, ms], ...]}, "sync_ms": {...}, "late_rank": [[step, rank]],
  "late_cost_ms": [[step, ms]]}, "profiles": {"mfu": [[step, value], ...], ...}}``: every ``tscope/roofline/<key>``
  scalar of the run's event files (the profiled steps and the automatic MFU windows, training stage) under its bare
  key, sorted by step; the step monitor's ``tscope/step/<key>`` and ``tscope/gpu/<key>`` scalars as ``step/<key>``
  and ``gpu/<key>``, its per-rank view (``tscope/ranks/{step_ms,sync_ms}/<rank>``, ``tscope/ranks/late_rank``,
  ``tscope/ranks/late_cost_ms``: each rank's step and wait for the others, the late rank and how long the others wait
  for it a step; only under DDP) under ``"ranks"``, and the run's alerts (the texts ``tscope/step/alerts``, the step
  monitor's, and ``tscope/nan``, the NaN guard's) under ``"alerts"``; where no event file holds a key, the profiled
  steps' header figures fill it. ``"profiles"`` holds the header figures of the readable step files only (the page
  marks the profiled steps with them).
- ``ops(run_dir, step, stage, layer) -> {"ops": [...], "total": int, "note": str|None}``: the step's ops in execution
  order, those of ``layer`` and its sub-modules (``layer`` empty: all ops, at most ``OPS_CAP`` with a note).
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from tscope_callbacks.analysis.report import (
    ALERTS_FILE,
    SCHEMA,
    ReportData,
    StepFileError,
    not_a_step_file,
    parse_step_file_name,
    read_alerts_file,
    read_step_json,
    step_file_name,
)
from tscope_callbacks.analysis.report import VERSION as SCHEMA_VERSION
from tscope_callbacks.render.dashboard import layer_details, open_step

__all__ = ["HINT", "HOW_TO", "OPS_CAP", "SCHEMA", "SCHEMA_VERSION", "StepFileError", "load", "ops", "read_step_file",
           "scan", "series", "step_path"]

OPS_CAP = 5000
#: how to get tscope data into a log dir (the command line's words; HINT adds the tab's)
HOW_TO = ("add the callback to your Trainer and train: Trainer(callbacks=[tscope_callbacks.RooflineCallback()], "
          "logger=TensorBoardLogger(\"<this log dir>\")); each profiled step writes <log_dir>/tscope/step_<N>.json")
HINT = f"No tscope data in this log dir. {HOW_TO[0].upper()}{HOW_TO[1:]}, which this tab reads."

_FILE_ONLY = ("profile", "device_spec")
_SERIES_PREFIXES = (("tscope/roofline/", ""), ("tscope/step/", "step/"), ("tscope/gpu/", "gpu/"))
_ALERTS_TAG = "tscope/step/alerts"
#: the alerts over the run: the step monitor's and the NaN guard's (non-finite events, gradient spikes: why a run
#: diverged; the page showed only the former, the latter only in TensorBoard's Text tab and the console)
_ALERT_KEYS = (_ALERTS_TAG, "tscope/nan")
_RANKS = "tscope/ranks/"
_HEADER_SERIES = ("mfu", "mbu", "hfu", "step_ms", "estimated_step_ms", "achieved_tflops", "tokens_per_s",
                  "samples_per_s", "memory_peak_bytes", "flop_coverage")




# ---------------------------------------------------------------------------------------------------- the cache
class _Cache:
    """Parsed files by (path, mtime_ns, size): a changed file is parsed again; at most ``size`` kept, and (with
    ``max_bytes``) files of at most that many bytes together (a parsed JSON takes several times its file's size)."""

    def __init__(self, size: int, max_bytes: int | None = None) -> None:
        self.size, self.max_bytes, self._d, self._lock = size, max_bytes, OrderedDict(), threading.Lock()

    def get(self, key: tuple) -> Any:
        with self._lock:
            if key in self._d:
                self._d.move_to_end(key)
                return self._d[key]
        return None

    def __contains__(self, key: tuple) -> bool:
        with self._lock:
            return key in self._d

    def put(self, key: tuple, value: Any) -> None:
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.size or (
                    self.max_bytes is not None and len(self._d) > 1
                    and sum(k[2] for k in self._d) > self.max_bytes):
                self._d.popitem(last=False)


_REPORTS = _Cache(16, max_bytes=48_000_000)  # key -> report dict or StepFileError (the newest kept always)
_STATUS = _Cache(4096)  # key -> (error or None (readable), layer details, header figures): small, for the index


def _key(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (str(path), st.st_mtime_ns, st.st_size)


# ---------------------------------------------------------------------------------------------------- one file
def _other_version(version: Any, name: str) -> StepFileError:
    found = "no schema version (an early tscope's)" if version is None else f"step-report schema version {version}"
    return StepFileError(f"{name}: {found}; this dashboard reads schema version {SCHEMA_VERSION}: profile the run "
                         "again with the installed tscope_callbacks")


def read_step_file(path: str | os.PathLike) -> dict:
    """The StepReport dict in one step file; ``StepFileError`` (one line) when it cannot be shown."""
    path = Path(path)
    name = path.name
    d = read_step_json(path, name)
    rep = d["report"] if "report" in d and "schema" not in d else d
    if rep is None:
        raise StepFileError(f"{name}: holds no report (the profile had no device roof: pass gpu=... to the "
                            "callback)")
    if not isinstance(rep, dict):
        raise StepFileError(f"{name}: not a step report (its 'report' is a JSON {type(rep).__name__})")
    schema, version = rep.get("schema"), rep.get("version")
    if schema not in (None, SCHEMA):
        raise StepFileError(f"{name}: schema {schema!r}, not a tscope step report ({SCHEMA!r})")
    if schema == SCHEMA and version == SCHEMA_VERSION:
        # the file keeps the raw profile and the device spec for re-analysis: not part of the report dict
        return {k: v for k, v in rep.items() if k not in _FILE_ONLY}
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise StepFileError(f"{name}: step-report schema version {version}, newer than this dashboard's "
                            f"{SCHEMA_VERSION}: upgrade tscope_callbacks")
    if not {"profile", "report", "schema", "version"} & d.keys():  # no step file of any version: say what it is
        raise StepFileError(not_a_step_file(name, d))
    raise _other_version(version if schema == SCHEMA else None, name)


def _parse_cached(path: Path) -> dict:
    key = _key(path)
    if key is None:
        raise StepFileError(f"{path.name}: no such step file")
    hit = _REPORTS.get(key)
    if hit is None:
        try:
            hit = read_step_file(path)
        except StepFileError as e:
            hit = e
        _REPORTS.put(key, hit)
        _STATUS.put(key, (str(hit), False, {}) if isinstance(hit, StepFileError) else
                    (None, layer_details(hit), _header_values(hit)))
    if isinstance(hit, StepFileError):
        raise hit
    return hit


def _header_values(d: dict) -> dict[str, float]:
    """The report's finite header figures (``ReportData.header``) named in ``_HEADER_SERIES``; {} when it does not
    read."""
    try:
        h = ReportData.from_dict({**d, "ops": []}).header
    except Exception:  # never let one file break the index
        return {}
    vals = {k: h[k].value for k in _HEADER_SERIES if k in h}
    return {k: float(v) for k, v in vals.items() if v is not None and math.isfinite(v)}


def _status(path: Path) -> tuple[str | None, bool, dict[str, float]]:
    """(None when the file is readable, else its error; whether it has layer details; its header figures), parsed
    once per (path, mtime, size)."""
    key = _key(path)
    if key is None:
        return f"{path.name}: removed while listing", False, {}
    if key not in _STATUS:
        try:
            _parse_cached(path)
        except StepFileError:
            pass
        except Exception as e:  # never let one file break the index
            _STATUS.put(key, (f"{path.name}: cannot be read ({type(e).__name__}: {e})", False, {}))
    return _STATUS.get(key) or (None, False, {})


# ---------------------------------------------------------------------------------------------------- the index
def step_path(run_dir: str | os.PathLike, step: int, stage: str = "train") -> Path:
    """``<run_dir>/tscope/step_<N>.json`` (other stages: ``<stage>_step_<N>.json``: ``analysis.report.step_file_name``)."""
    return Path(run_dir) / "tscope" / step_file_name(step, stage)


def _step_files(tdir: Path) -> list[tuple[str, int, Path]]:
    out = []
    try:
        entries = list(os.scandir(tdir))
    except OSError:
        return out
    for e in entries:
        parsed = parse_step_file_name(e.name)
        if parsed is None or parsed[0] != "step":  # a trace or a layer tree: other outputs
            continue
        out.append((parsed[1], parsed[2], Path(e.path)))
    return sorted(out, key=lambda t: (t[0] != "train", t[0], t[1]))


def _run_dirs(logdir: Path) -> list[Path]:
    found = []
    for root, dirs, _files in os.walk(logdir, followlinks=False):
        dirs.sort()
        if "tscope" in dirs and _step_files(Path(root) / "tscope"):
            found.append(Path(root))
        dirs[:] = [d for d in dirs if d != "tscope" and not d.startswith(".")]
    return found


def run_name(logdir: str | os.PathLike, run_dir: str | os.PathLike) -> str:
    """TensorBoard's name of a run: its path relative to the log dir (``"."`` for the log dir itself)."""
    rel = os.path.relpath(run_dir, logdir)
    return rel.replace(os.sep, "/")


def scan(logdir: str | os.PathLike) -> dict:
    """The runs index (see the module docstring); never raises."""
    logdir = Path(logdir)
    if not logdir.is_dir():
        return {"runs": [], "hint": f"The log dir {str(logdir)!r} does not exist (yet). " + HINT}
    if logdir.name == "tscope" and _step_files(logdir):  # a run's own step folder: that run
        logdir = logdir.parent
    runs = []
    for rd in _run_dirs(logdir):
        steps = []
        for stage, step, path in _step_files(rd / "tscope"):
            err, details, _ = _status(path)
            steps.append({"step": step, "stage": stage, "readable": err is None, "error": err, "details": details})
        runs.append({"run": run_name(logdir, rd), "dir": str(rd), "steps": steps, "open": open_step(steps)})
    return {"runs": runs, "hint": None if runs else HINT}


def load(run_dir: str | os.PathLike, step: int, stage: str = "train") -> dict:
    """One step's StepReport dict, or ``{"error": "<one line>"}``; never raises."""
    try:
        return _parse_cached(step_path(run_dir, step, stage))
    except StepFileError as e:
        return {"error": str(e)}
    except Exception as e:
        return {"error": f"step {step} ({stage}): cannot be read ({type(e).__name__}: {e})"}


def ops(run_dir: str | os.PathLike, step: int, stage: str = "train", layer: str = "", cap: int = OPS_CAP) -> dict:
    """The step's ops of ``layer`` and its sub-modules (all ops when empty, at most ``cap``), or an error dict."""
    rep = load(run_dir, step, stage)
    if "error" in rep and "schema" not in rep:
        return rep
    rows = rep.get("ops") or []
    if layer:
        pre = layer + "."
        rows = [o for o in rows if (o.get("layer") or "") == layer or (o.get("layer") or "").startswith(pre)]
    note = None
    if len(rows) > cap:
        note = f"the first {cap} of {len(rows)} ops in execution order (pick a layer to see its ops)"
    return {"ops": rows[:cap], "total": len(rows), "note": note}


# ---------------------------------------------------------------------------------------------------- series
def _bare(tag: str) -> str | None:
    """The series key of a scalar tag (``tscope/roofline/mfu`` -> ``mfu``, ``tscope/step/host_ms`` ->
    ``step/host_ms``), None for other tags, other stages (``tscope/roofline/<stage>/<key>``) and tables."""
    for pre, alias in _SERIES_PREFIXES:
        if tag.startswith(pre):
            rest = tag[len(pre):]
            return None if not rest or "/" in rest else alias + rest
    if tag.startswith(_RANKS):  # the step monitor's per-rank view: ranks/<key> and ranks/<key>/<rank>
        rest = tag[len(_RANKS):]
        parts = rest.split("/")
        ok = len(parts) == 1 or (len(parts) == 2 and parts[1].isdigit())
        return "ranks/" + rest if rest and ok and all(parts) else None
    return None


def _ranks(merged: dict[str, dict[int, float]]) -> dict[str, Any]:
    """The per-rank series out of ``merged`` (removed from it): ``{"step_ms": {"<rank>": [[step, ms], ...]},
    "sync_ms": {...}, "late_rank": [[step, rank]], "late_cost_ms": [[step, ms]]}``."""
    out: dict[str, Any] = {}
    for key in [k for k in merged if k.startswith("ranks/")]:
        d = merged.pop(key)
        pts = [[s, d[s]] for s in sorted(d)]
        parts = key.split("/")[1:]
        if len(parts) == 2:
            out.setdefault(parts[0], {})[parts[1]] = pts
        else:
            out[parts[0]] = pts
    return out


def _text_of(tensor: Any) -> str:
    """The text of a text summary's tensor (TensorBoard's text plugin: a string tensor, one or more entries)."""
    try:
        vals = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in tensor.string_val]
    except Exception:
        return ""
    return "\n".join(v for v in vals if v).strip()


class _EventReader:
    """One event file read incrementally: a file still being written is read from where the last call stopped."""

    def __init__(self, path: Path, ino: int) -> None:
        from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

        self.ino, self.size = ino, -1
        self.loader = LegacyEventFileLoader(str(path))
        self.out: dict[str, list[list[float]]] = {}
        self.alerts: list[list[Any]] = []  #: [step, text] of each alert entry (``_ALERT_KEYS``)

    def read(self, size: int) -> dict[str, list[list[float]]]:
        if size == self.size:
            return self.out
        from tensorboard.util import tensor_util

        try:
            for ev in self.loader.Load():
                if not ev.HasField("summary"):
                    continue
                for v in ev.summary.value:
                    if v.tag.startswith(_ALERT_KEYS) and v.WhichOneof("value") == "tensor":
                        text = _text_of(v.tensor)
                        if text:
                            self.alerts.append([int(ev.step), text])
                        continue
                    bare = _bare(v.tag)
                    if bare is None:
                        continue
                    kind = v.WhichOneof("value")
                    if kind == "simple_value":
                        val = float(v.simple_value)
                    elif kind == "tensor":
                        try:
                            val = float(tensor_util.make_ndarray(v.tensor).reshape(-1)[0])
                        except Exception:
                            continue
                    else:
                        continue
                    if math.isfinite(val):
                        self.out.setdefault(bare, []).append([int(ev.step), val])
        except Exception:
            pass  # a record still being written: the next call goes on from the last complete one
        self.size = size
        return self.out


_READERS: dict[str, _EventReader] = {}
_READERS_LOCK = threading.Lock()


def _event_scalars(path: Path) -> tuple[dict[str, list[list[float]]], list[list[Any]]]:
    """The series scalars of one event file (``tscope/roofline/*`` training stage, ``tscope/step/*``,
    ``tscope/gpu/*``) by key (:func:`_bare`), and its alerts; read incrementally."""
    try:
        st = path.stat()
    except OSError:
        return {}, []
    with _READERS_LOCK:
        r = _READERS.get(str(path))
        if r is None or r.ino != st.st_ino or st.st_size < r.size:  # new, replaced or truncated: from the start
            if len(_READERS) > 256:
                _READERS.clear()
            r = _READERS[str(path)] = _EventReader(path, st.st_ino)
        return r.read(st.st_size), list(r.alerts)


def series(run_dir: str | os.PathLike) -> dict:
    """The run's over-time series (see the module docstring); never raises."""
    run_dir = Path(run_dir)
    merged: dict[str, dict[int, float]] = {}
    try:
        files = sorted(p for p in run_dir.iterdir() if p.name.startswith("events.out.tfevents"))
    except OSError:
        files = []
    alerts: list[list[Any]] = []
    for f in files:
        scalars, file_alerts = _event_scalars(f)
        alerts += file_alerts
        for k, pts in scalars.items():
            d = merged.setdefault(k, {})
            for s, v in pts:
                d[int(s)] = v  # a later event at the same step wins, as in TensorBoard
    profiles: dict[str, dict[int, float]] = {}
    for stage, step, path in _step_files(run_dir / "tscope"):
        err, _, header = _status(path) if stage == "train" else ("", False, {})
        if err is not None:
            continue
        for k, v in header.items():
            profiles.setdefault(k, {})[step] = v
    for k, pts in profiles.items():
        d = merged.setdefault(k, {})
        for s, v in pts.items():
            d.setdefault(s, v)
    ranks = _ranks(merged)
    out: dict[str, Any] = {k: [[s, d[s]] for s in sorted(d)] for k, d in sorted(merged.items())}
    if ranks:
        out["ranks"] = ranks
    out["profiles"] = {k: [[s, d[s]] for s in sorted(d)] for k, d in sorted(profiles.items())}
    # the run's alerts file holds them whatever the logger (a TensorBoard run has each in its events too: once)
    alerts += [[a["step"], a["text"]] for a in read_alerts_file(run_dir / "tscope" / ALERTS_FILE)
               if a.get("key") in _ALERT_KEYS]
    seen: set[tuple[int, str]] = set()
    alerts = [a for a in sorted(alerts, key=lambda a: a[0]) if (a[0], a[1]) not in seen and not seen.add((a[0], a[1]))]
    if alerts:
        out["alerts"] = alerts
    return out
