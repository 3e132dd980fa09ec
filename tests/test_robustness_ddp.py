"""All three callbacks together under 2-process DDP on CPU (gloo), with a NaN on rank 1 only inside a profiled step:
no hang, one set of logs, the same profiled steps and the same NaN decision on both ranks, nothing left behind.

(``test_callbacks_ddp.py`` covers the profiling callbacks alone, ``test_nan_guard_ddp.py`` the guard alone; this is
the combination.) Runs as a subprocess under a timeout, so a hang fails the test. Skip with ``TSCOPE_SKIP_DDP=1``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ddp_harness import run_ddp, skip_ddp
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = skip_ddp

SCRIPT = """
    import json, os, sys
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger
    from robust_utils import FAST, MLPModule, all_callbacks, assert_nothing_left

    torch.set_num_threads(1)
    out = sys.argv[1]
    model = MLPModule(dropout=0.0)

    def inject(mod, args, o):  # NaN activations on rank 1 only, in profiled step 2
        t = model.trainer
        return o * float("nan") if t.global_rank == 1 and t.global_step == 2 else o

    handle = model.net[2].register_forward_hook(inject)
    cbs = all_callbacks(start_step=1, every_n_steps=2, nan_action="stop")
    trainer = pl.Trainer(strategy="ddp", max_steps=6, default_root_dir=out, callbacks=cbs,
                         logger=TensorBoardLogger(out, name="tb"), **{**FAST, "devices": 2})
    trainer.fit(model)
    handle.remove()
    assert_nothing_left(model, trainer.optimizers)
    roof, layers, guard = cbs
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump({"global_step": trainer.global_step, "steps": [h["step"] for h in roof.history],
                   "times": roof.last_profile.info.rank_step_times_s,
                   "nonfinite_out": layers.last_layers["net.2"].nonfinite_output,
                   "fwd_matmuls": sum(r.phase == "forward" and r.category == "matmul" for r in roof.last_profile.ops),
                   "events": [e.to_dict() for e in guard.events], "replays": guard.replays}, f)
"""


def test_all_callbacks_two_process_ddp_with_a_nan_on_one_rank(tmp_path: Path) -> None:
    results = run_ddp(tmp_path, SCRIPT, name="ddp_all.py")

    r0, r1 = results
    assert r0["global_step"] == r1["global_step"] == 3  # both stopped after the bad step 2 (consensus)
    assert r0["steps"] == r1["steps"] == [1, 2] and r0["times"] == r1["times"] and len(r0["times"]) == 2
    e0, e1 = r0["events"], r1["events"]
    assert len(e0) == len(e1) == 1 and e0[0]["step"] == e1[0]["step"] == 2
    assert e0[0]["ranks"] == e1[0]["ranks"] == [1] and e0[0]["layer"] == "net.2"
    assert r1["nonfinite_out"] and not r0["nonfinite_out"]  # each rank's own layer flags
    assert r0["fwd_matmuls"] == r1["fwd_matmuls"] == 2  # the replay on rank 1 is not in its profile

    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["version_0"]  # one set of logs
    log_dir = tmp_path / "tb" / "version_0"
    assert sorted(p.name for p in (log_dir / "tscope").iterdir()) == [
        "alerts.jsonl", "layers_step_1.json", "layers_step_2.json", "step_1.json", "step_2.json"]
    # rank zero wrote the NaN alert once (the event names rank 1)
    (alert,) = [json.loads(x) for x in (log_dir / "tscope" / "alerts.jsonl").read_text().splitlines()]
    assert alert["key"] == "tscope/nan" and alert["step"] >= 2 and "net.2" in alert["text"]
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert {"tscope/roofline/mfu", "tscope/roofline/step_ms_max", "tscope/nan/events"} <= set(acc.Tags()["scalars"])
    assert [e.value for e in acc.Scalars("tscope/nan/events")] == [1.0]
    assert any(t.startswith("tscope/nan") for t in acc.Tags()["tensors"])
