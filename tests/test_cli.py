"""The ``tscope`` console script: every subcommand's ``--help``, ``tscope specs``, ``tscope analyze``, ``tscope report``.

In-process through ``tscope_callbacks.cli.main`` (the console script's entry point), plus one real subprocess of the
installed ``tscope`` script so the entry point itself is exercised.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_models import SmallConvNet

import tscope_callbacks as ts
from tscope_callbacks.cli import _COMMANDS, main

SUBCOMMANDS = ["demo", "analyze", "specs", "calibrate", "report", "diff", "view"]


def test_every_subcommand_is_routed() -> None:
    assert sorted(_COMMANDS) == sorted(SUBCOMMANDS)


@pytest.mark.parametrize("command", [None, *SUBCOMMANDS])
def test_help_exits_zero(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--help"] if command is None else [command, "--help"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: tscope{'' if command is None else ' ' + command}")
    if command is None:
        for name in SUBCOMMANDS:
            assert name in out
    else:
        assert _COMMANDS[command][1] in " ".join(out.split())  # the one-line description


def test_demo_help_names_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    for opt in ("--steps", "--logger", "--nan-at", "--every", "--out", "--threads"):
        assert opt in out
    assert "model.blocks.1.mlp.fc" in " ".join(out.split())


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_installed_console_script_runs() -> None:
    exe = Path(sys.executable).with_name("tscope")
    if not exe.exists():
        exe = shutil.which("tscope")
        if exe is None:
            pytest.skip("the tscope console script is not installed in this environment")
    res = subprocess.run([str(exe), "specs", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "usage: tscope specs" in res.stdout


# ---------------- tscope specs ----------------
def test_specs_lists_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["specs"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("device")
    for name in ("NVIDIA L4 ", "NVIDIA L40S", "NVIDIA H100 SXM", "NVIDIA H200", "AMD Instinct MI300X"):
        assert name in out
    assert "devices; dense peaks" in out


def test_specs_shows_the_l40s_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["specs", "NVIDIA L40S"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("NVIDIA L40S")  # the L40S row itself, not the L4 (a substring match would say L4)
    assert "864 GB/s" in out
    bf16 = next(line for line in out.splitlines() if line.startswith("bf16"))
    assert "362.05" in bf16


def test_specs_json_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["specs", "NVIDIA L40S", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["name"] == "NVIDIA L40S"
    assert row["bandwidth"] == pytest.approx(864e9)


def test_unknown_gpu_exits_2_with_closest_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["specs", "NVIDIA L40X"]) == 2
    err = capsys.readouterr().err
    assert "unknown device 'NVIDIA L40X'" in err
    assert "Closest known names" in err and "'NVIDIA L40S'" in err and "'NVIDIA L40'" in err
    assert "Traceback" not in err


# ---------------- tscope analyze ----------------
def test_analyze_tinygpt(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json = tmp_path / "tinygpt.json"
    rc = main(["analyze", "tscope_callbacks.demo.model:TinyGPT", "--input-shape", "8,64", "--input-dtype", "long",
               "--gpu", "h100", "--precision", "bf16", "--json", str(out_json), "--print"])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.startswith("## Roofline — NVIDIA H100 SXM · TinyGPT")
    assert "bf16 dominant" in out
    assert "FLOP coverage 100%" in out
    assert "| layer | type | phase |" in out and "Opportunities" in out
    from tscope_callbacks.demo.model import GPTConfig, matmul_flops

    prof = json.loads(out_json.read_text())["profile"]
    linears = sum(o["flops"] for o in prof["ops"] if o["category"] == "matmul")
    assert linears == matmul_flops(GPTConfig(), 8)["total"]  # forward only: the default config's Linear layers
    assert any(o["category"] == "attention" and o["flops"] > 0 for o in prof["ops"])  # SDPA counted too
    assert {o["dtype"] for o in prof["ops"] if o["category"] == "matmul"} == {"bfloat16"}


def test_analyze_a_hugging_face_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """hf:MODEL_TYPE with config overrides, and hf:DIR (a saved config): the same counts as analyze_model on the
    model built from that config; a misspelt type is one line naming close ones (no Hub request)."""
    transformers = pytest.importorskip("transformers")
    small = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 256}
    common = ["--input-shape", "2,16", "--gpu", "h100", "--precision", "bf16", "--backward"]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["analyze", "hf:llama", "--kwargs", json.dumps(small), "--json", str(a), *common, "--print"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## Roofline — NVIDIA H100 SXM · LlamaForCausalLM") and "FLOP coverage 100%" in out
    cfg = transformers.LlamaConfig(**small)
    cfg.save_pretrained(tmp_path / "cfg")
    assert main(["analyze", f"hf:{tmp_path / 'cfg'}", "--json", str(b), *common]) == 0
    out = capsys.readouterr().out  # a file written: one line saying so, not the report
    assert out.startswith(f"JSON written to {b}") and len(out.strip().splitlines()) == 1
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    direct = ts.analyze_model(model, input_shape=[(2, 16)], gpu="h100", precision="bf16", backward=True)
    for path in (a, b):
        ops = json.loads(path.read_text())["profile"]["ops"]
        assert sum(o["flops"] for o in ops) == direct.summary.total_flops > 0
    assert main(["analyze", "hf:lama", "--input-shape", "2,16"]) == 2
    err = capsys.readouterr().err
    assert "'lama' is not a transformers model type (close: llama" in err and len(err.strip().splitlines()) == 1


def test_analyze_helper_model_resnet_shape(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json = tmp_path / "conv.json"
    rc = main(["analyze", "cli_models:SmallConvNet", "--input-shape", "32,3,224,224", "--gpu", "h100",
               "--precision", "bf16", "--json", str(out_json), "--plot", str(tmp_path / "roof.png")])
    assert rc == 0
    out = capsys.readouterr().out  # files written: one line each, no report
    assert out.startswith("plot written to") and "JSON written to" in out and len(out.strip().splitlines()) == 2
    assert "re-renders it for NVIDIA H100 SXM" in out
    assert (tmp_path / "roof.png").stat().st_size > 0
    ops = json.loads(out_json.read_text())["profile"]["ops"]
    by_layer = {o["layer"]: o["flops"] for o in ops if o["category"] in ("conv", "matmul")}
    assert by_layer == SmallConvNet().expected_flops(32, 224, 224)


def test_report_on_an_analyze_json_keeps_the_analysed_device(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    # used to re-rate the meta profile on this machine's CPU (0.02 ms on the H100 became 528 ms)
    out_json = tmp_path / "gpt.json"
    assert main(["analyze", "tscope_callbacks.demo.model:TinyGPT", "--input-shape", "8,64", "--gpu", "h100",
                 "--precision", "bf16-mixed", "--json", str(out_json), "--print"]) == 0
    first = capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["device"]["name"] == "NVIDIA H100 SXM" and data["profile"]["info"]["device_name"] == "NVIDIA H100 SXM"
    assert main(["report", str(out_json)]) == 0
    again = capsys.readouterr().out
    assert again.startswith("## Roofline — NVIDIA H100 SXM")
    head = [ln for ln in first.splitlines() if ln.startswith("- **Step**")]
    assert head and head == [ln for ln in again.splitlines() if ln.startswith("- **Step**")]  # same estimate
    # token ids inferred (TinyGPT starts with an embedding): no --input-dtype needed
    assert any(o["category"] == "embedding" for o in data["profile"]["ops"])


def test_analyze_a_whole_training_step(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json = tmp_path / "step.json"
    rc = main(["analyze", "tscope_callbacks.demo.model:TinyGPT", "--input-shape", "8,64", "--input-dtype", "long",
               "--gpu", "h100", "--precision", "bf16-mixed", "--backward", "--optimizer", "adamw-fused",
               "--json", str(out_json)])
    assert rc == 0
    ops = json.loads(out_json.read_text())["profile"]["ops"]
    assert [o["op"] for o in ops if o["phase"] == "optimizer"] == ["aten._foreach_add_", "aten._fused_adamw_"]
    capsys.readouterr()
    # an update without gradients is a clear error, exit 2
    assert main(["analyze", "tscope_callbacks.demo.model:TinyGPT", "--input-shape", "8,64", "--input-dtype", "long",
                 "--gpu", "h100", "--optimizer", "adamw"]) == 2
    assert "--optimizer needs --backward" in capsys.readouterr().err  # in the CLI's words


def test_analyze_fsdp_what_if_and_its_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json = tmp_path / "fsdp.json"
    assert main(["analyze", "tscope_callbacks.demo.model:TinyGPT", "--input-shape", "8,64", "--gpu", "h100",
                 "--precision", "bf16-mixed", "--backward", "--optimizer", "adamw", "--fsdp", "4",
                 "--json", str(out_json), "--print"]) == 0
    out = capsys.readouterr().out
    # demo TinyGPT (vocab 512, d 128, seq 64, 2 blocks): 2 blocks + the root gathered forward, the blocks again in
    # backward: 5 all-gathers; 3 reduce-scatters
    assert "### FSDP over 4 GPUs (what-if, per GPU)" in out and "2 x Block + the root" in out
    assert "all-gather ×5" in out and "reduce-scatter ×3" in out and "gathered in bfloat16" in out
    # the what-if travels with the profile: `tscope report` shows it again
    assert main(["report", str(out_json)]) == 0
    assert "### FSDP over 4 GPUs" in capsys.readouterr().out
    assert main(["analyze", "tscope_callbacks.demo.model:TinyGPT", "--input-shape", "8,64", "--gpu", "h100",
                 "--backward", "--fsdp", "4", "--fsdp-units", "NoSuchBlock"]) == 2
    assert "no module of class 'NoSuchBlock'" in capsys.readouterr().err
    # HSDP: 16 GPUs in 2 replicas of 8-GPU shards; 3 all-reduces (the 2 blocks' and the root's shards)
    assert main(["analyze", "tscope_callbacks.demo.model:TinyGPT", "--input-shape", "8,64", "--gpu", "h100",
                 "--backward", "--fsdp", "16", "--fsdp-shard", "8"]) == 0
    out = capsys.readouterr().out
    assert "### HSDP over 16 GPUs (2 replicas x 8-GPU shards)" in out and "all-reduce across the 2 replicas ×3" in out
    assert main(["analyze", "tscope_callbacks.demo.model:TinyGPT", "--input-shape", "8,64", "--gpu", "h100",
                 "--backward", "--fsdp", "16", "--fsdp-shard", "5"]) == 2
    assert "shard_size must divide the 16 GPUs" in capsys.readouterr().err


def test_analyze_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "cli_models:SmallConvNet", "--input-shape", "2,3,8,8", "--gpu", "NVIDIA L40X"]) == 2
    assert "Closest known names" in capsys.readouterr().err
    assert main(["analyze", "cli_models", "--input-shape", "2,3,8,8"]) == 2
    assert "expected MODULE:NAME" in capsys.readouterr().err
    assert main(["analyze", "cli_models:NoSuchModel", "--input-shape", "2,3,8,8"]) == 2
    assert "NoSuchModel" in capsys.readouterr().err


_USER_MODELS = """
import torch
from user_blocks import Block  # a sibling module: imports resolve as `python models.py` would

BUILT_ON = []


def build(width=32):
    m = torch.nn.Sequential(Block(width), torch.nn.Linear(width, 10))
    BUILT_ON.append(next(m.parameters()).device.type)
    return m


class Zoo:
    small = staticmethod(lambda: build(16))


NOT_A_MODEL = 3


class Broken(torch.nn.Linear):
    def forward(self, x):
        raise RuntimeError("Expected inputs of BF16 type but got float32\\n  (a long C++ trace)")


def broken():
    return Broken(32, 32)
"""


@pytest.fixture()
def user_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's project directory: models.py (importing its sibling user_blocks.py), the working directory."""
    (tmp_path / "user_blocks.py").write_text("import torch\n\n\nclass Block(torch.nn.Linear):\n"
                                             "    def __init__(self, w):\n        super().__init__(w, w)\n")
    (tmp_path / "models.py").write_text(_USER_MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for name in ("models", "user_blocks"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_analyze_imports_from_the_working_directory_and_builds_on_meta(capsys: pytest.CaptureFixture[str],
                                                                        user_project: Path) -> None:
    # a console script's sys.path lacks the working directory: `tscope analyze models:build` in one's project
    # raised ModuleNotFoundError
    assert main(["analyze", "models:build", "--input-shape", "4,32", "--gpu", "h100", "--kwargs", '{"width": 32}']) == 0
    assert "NVIDIA H100 SXM" in capsys.readouterr().out
    models = sys.modules["models"]
    assert models.BUILT_ON == ["meta"]  # a meta analysis builds the model on meta: no memory, no init compute
    # a dotted NAME
    assert main(["analyze", "models:Zoo.small", "--input-shape", "4,16", "--gpu", "h100"]) == 0
    assert models.BUILT_ON[-1] == "meta"
    capsys.readouterr()
    # measured on the CPU: built on the CPU
    assert main(["analyze", "models:build", "--input-shape", "4,32", "--device", "cpu"]) == 0
    assert models.BUILT_ON[-1] == "cpu"


def test_analyze_a_model_file_by_path(capsys: pytest.CaptureFixture[str], user_project: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = user_project / "runs"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["analyze", str(user_project / "models.py") + ":build", "--input-shape", "4,32", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    # Sequential(Block(32), Linear(32, 10)) on 4 rows, forward: 2*4*32*32 + 2*4*32*10 = 8192 + 2560 FLOPs
    assert "NVIDIA H100 SXM · Sequential" in out
    assert main(["analyze", "../models.py:build", "--input-shape", "4,32", "--gpu", "h100", "--json",
                 "a.json"]) == 0
    capsys.readouterr()
    ops = json.loads((elsewhere / "a.json").read_text())["profile"]["ops"]
    assert sum(o["flops"] for o in ops if o["category"] == "matmul") == 2 * 4 * 32 * 32 + 2 * 4 * 32 * 10


@pytest.mark.parametrize("target, message", [
    ("no_such_module:build", "searched the current directory and PYTHONPATH"),
    ("missing.py:build", "no file 'missing.py'"),
    ("models:nope", "'models' has no 'nope'"),
    ("models:NOT_A_MODEL", "is not a model class or factory (it is of type int)"),
    # the model's own forward fails (an op that autocast does not cast, no meta kernel): one line and what to try
    ("models:broken", "the model raised RuntimeError: Expected inputs of BF16 type but got float32 at models.py:23 "
                      "in forward, run on meta with --input-shape 4,32 at --precision fp32. Try another --precision"),
])
def test_analyze_target_errors_say_what_to_do(capsys: pytest.CaptureFixture[str], user_project: Path, target: str,
                                              message: str) -> None:
    assert main(["analyze", target, "--input-shape", "4,32"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# ---------------- tscope report ----------------
def test_report_rerenders_an_analyze_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json = tmp_path / "conv.json"
    assert main(["analyze", "cli_models:SmallConvNet", "--input-shape", "4,3,32,32", "--gpu", "a100",
                 "--json", str(out_json), "--print"]) == 0
    first = capsys.readouterr().out
    assert main(["report", str(out_json), "--gpu", "a100", "--csv", str(tmp_path / "rows.csv"), "--print"]) == 0
    again = capsys.readouterr().out
    assert again.splitlines()[0] == first.splitlines()[0]
    assert (tmp_path / "rows.csv").read_text().count("\n") > 3
    assert main(["report", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_report_into_a_closed_pipe_is_not_an_error(tmp_path: Path) -> None:
    import subprocess

    from tscope_callbacks.demo.model import TinyGPT, random_tokens

    m = TinyGPT()
    x, y = random_tokens(m.cfg, batch=2)
    with ts.profile(m) as p:
        m.loss(x, y).backward()
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"profile": p.result.to_dict(), "device": ts.get_device_spec("h100").to_dict()}))
    proc = subprocess.run(f"{sys.executable} -m tscope_callbacks.cli report {path} --top 50 | head -1", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith("## Roofline") and "BrokenPipeError" not in proc.stderr, proc.stderr[-2000:]
