"""NaNGuardCallback under 2-process DDP on CPU (gloo): NaN on rank 1 only -> both ranks act on the same step.

Lightning's DDP launcher re-executes the script it was started from, so the training script is written to a file and
run with ``subprocess`` under a timeout: a hang (one rank waiting in a collective) fails the test instead of blocking
CI. Skip with ``TSCOPE_SKIP_DDP=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("TSCOPE_SKIP_DDP") == "1", reason="TSCOPE_SKIP_DDP=1")

SCRIPT = textwrap.dedent('''
    import json, os, sys
    sys.path.insert(0, {tests_dir!r})
    import torch
    import lightning.pytorch as pl
    from models import TinyLM
    from tscope_callbacks import NaNGuardCallback

    torch.set_num_threads(1)
    out_dir = sys.argv[1]
    model = TinyLM(n_batches=16)

    def inject(mod, args, out):  # NaN in block 1's MLP output, on rank 1 only, at optimizer step 3
        t = model.trainer
        return out * float("nan") if t.global_rank == 1 and t.global_step == 3 else out

    model.model.blocks[1].mlp.register_forward_hook(inject)
    guard = NaNGuardCallback(action="stop")
    trainer = pl.Trainer(max_steps=10, accelerator="cpu", devices=2, strategy="ddp", callbacks=[guard],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False)
    trainer.fit(model)
    with open(os.path.join(out_dir, f"rank{{trainer.global_rank}}.json"), "w") as f:
        json.dump({{"rank": trainer.global_rank, "global_step": trainer.global_step, "replays": guard.replays,
                   "events": [e.to_dict() for e in guard.events]}}, f)
''')


def test_ddp_nan_on_rank1_only(tmp_path: Path):
    script = tmp_path / "ddp_nan.py"
    script.write_text(SCRIPT.format(tests_dir=str(Path(__file__).parent)))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29500 + os.getpid() % 1000),
           "PL_DISABLE_FORK": "1", "OMP_NUM_THREADS": "1"}
    env.pop("LOCAL_RANK", None)
    try:
        proc = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"DDP run hung (timeout 120 s):\n{(e.stderr or b'')[-3000:]!r}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for res in results:
        assert res["global_step"] == 4, res  # both ranks stopped after step 3
        (ev,) = res["events"]
        assert ev["step"] == 3 and ev["ranks"] == [1]
        assert ev["kind"] == "activation" and ev["layer"] == "model.blocks.1.mlp"  # merged from rank 1's replay
    assert "all-reduce" in results[0]["events"][0]["note"]
