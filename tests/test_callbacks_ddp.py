"""Both profiling callbacks under 2-process DDP on CPU (gloo): same steps profiled on every rank, per-rank step
times gathered, one set of logs (rank zero's). Runs as a subprocess with a timeout so a hang fails instead of
blocking. Skip with ``TSCOPE_SKIP_DDP=1``."""

from __future__ import annotations

import json
from pathlib import Path

from ddp_harness import run_ddp, skip_ddp
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = skip_ddp

SCRIPT = """
    import json, os, sys
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger
    from cb_utils import FAST, test_spec
    from models import TinyLM
    import tscope_callbacks as ts

    out = sys.argv[1]
    roof = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=2, outputs=ts.RooflineOutputs(plot=False))
    lay = ts.LayerProfilerCallback(depth=2, start_step=1, every_n_steps=2)
    watch = ts.WatchCallback(every_n_steps=2, update_ratio=True)
    flags = {**FAST, "devices": 2}
    trainer = pl.Trainer(strategy="ddp", max_steps=4, default_root_dir=out, callbacks=[roof, lay, watch],
                         logger=TensorBoardLogger(out, name="tb"), **flags)
    trainer.fit(TinyLM())
    rank = trainer.global_rank
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"steps": [h["step"] for h in roof.history],
                   "times": roof.last_profile.info.rank_step_times_s, "layers": sorted(lay.last_layers),
                   "watched": watch.last and [watch.last["step"], len(watch.last["gradients"]),
                                              sorted(watch.last["update_ratio"])[:1]]}, f)
"""


def test_ddp_two_processes(tmp_path: Path) -> None:
    results = run_ddp(tmp_path, SCRIPT, name="ddp_run.py")

    ranks = results
    assert ranks[0]["steps"] == ranks[1]["steps"] == [1, 2]  # every rank profiled the same steps
    assert ranks[0]["times"] == ranks[1]["times"] and len(ranks[0]["times"]) == 2  # gathered from both ranks
    assert ranks[0]["layers"] == ranks[1]["layers"]
    # replicated gradients: rank zero's histograms are every rank's; the other rank does no histogram work
    assert ranks[0]["watched"][:2] == [2, 29] and ranks[1]["watched"] is None

    versions = sorted(p.name for p in (tmp_path / "tb").iterdir())
    assert versions == ["version_0"]  # one set of logs
    log_dir = tmp_path / "tb" / "version_0"
    files = sorted(p.name for p in (log_dir / "tscope").iterdir())
    assert files == ["layers_step_1.json", "layers_step_2.json", "step_1.json", "step_2.json"]
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert len(acc.Tags()["histograms"]) == 29 and "tscope/update_ratio/total" in scalars  # one set of histograms
    assert {"tscope/roofline/step_ms_min", "tscope/roofline/step_ms_max", "tscope/roofline/mfu"} <= set(scalars)
    mins, maxs = acc.Scalars("tscope/roofline/step_ms_min"), acc.Scalars("tscope/roofline/step_ms_max")
    assert [e.step for e in mins] == [1, 2] and all(a.value <= b.value for a, b in zip(mins, maxs))
    table = json.loads((log_dir / "tscope" / "step_2.json").read_text())["profile"]["info"]["rank_step_times_s"]
    assert len(table) == 2
