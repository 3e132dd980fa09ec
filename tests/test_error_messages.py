"""Bad input gets one line that says what to do: from the API an exception naming the argument, from the CLI exit 2
with no traceback and the option named. Each case was a deep torch error, a bare Python one, or accepted silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tscope_callbacks as ts
from tscope_callbacks.cli import main
from tscope_callbacks.inputs import ModelRunError


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


# ---------------------------------------------------------------- API
def test_roofline_of_none_names_what_it_needs() -> None:
    with pytest.raises(TypeError, match=r"needs a profiled step: the `prof` of `with ts.profile"):
        ts.roofline(None)


def test_a_mismatched_input_shape_names_input_shape_not_torch_internals() -> None:
    # Linear(8, 16) given 9 features: torch says "mat1 and mat2 shapes cannot be multiplied", 20 frames deep
    with pytest.raises(ModelRunError) as exc:
        ts.analyze_model(_mlp(), input_shape=[(4, 9)], gpu="h100")
    msg = str(exc.value)
    assert msg.startswith("the model raised RuntimeError: ")
    assert "input_shape=[(4, 9)]" in msg and "Check input_shape: one shape per argument of the model's forward" in msg
    assert exc.value.__suppress_context__ and exc.value.hint == "input_shape"
    assert isinstance(exc.value.error, RuntimeError)  # the model's own exception, kept for debugging
    # on a real device too
    with pytest.raises(ModelRunError, match="run on cpu with input_shape"):
        ts.analyze_model(_mlp(), input_shape=[(4, 9)], gpu="h100", device="cpu")


@pytest.mark.parametrize("shape, bad", [([(4, -3)], "input_shape[0] = (4, -3)"), ([(4, 0)], "input_shape[0] = (4, 0)"),
                                        ([(4, 2.5)], "input_shape[0] = (4, 2.5)"), ("4,8", "'4,8'"), ([], "[]")])
def test_a_bad_input_shape_is_refused_before_running(shape: object, bad: str) -> None:
    with pytest.raises(ValueError) as exc:
        ts.analyze_model(_mlp(), input_shape=shape, gpu="h100")  # type: ignore[arg-type]
    assert bad in str(exc.value) and "input_shape" in str(exc.value)
    assert not isinstance(exc.value, ModelRunError)


# ---------------------------------------------------------------- CLI
def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``tscope argv``: it must exit 2 (argparse's SystemExit or run's return) with one message and no trace."""
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("argv, option, says", [
    (["--input-shape", "8,x"], "--input-shape", "'8,x' is not a shape: give comma-separated whole numbers"),
    (["--input-shape", "8,-3"], "--input-shape", "every dimension must be 1 or more"),
    (["--input-shape", "4,8", "--kwargs", "{bad"], "--kwargs", "not valid JSON"),
    (["--input-shape", "4,8", "--kwargs", "[1]"], "--kwargs", "a JSON object"),
    (["--input-shape", "4,8", "--top", "-3"], "--top", "-3 is not a whole number >= 1"),
    (["--input-shape", "4,8", "--fsdp", "1"], "--fsdp", "1 is not a whole number >= 2"),
])
def test_analyze_refuses_bad_options_naming_them(capsys: pytest.CaptureFixture[str], argv: list[str], option: str,
                                                 says: str) -> None:
    err = _cli(capsys, "analyze", "tscope_callbacks.demo.model:TinyGPT", *argv)
    assert f"argument {option}" in err and says in err


def test_analyze_device_cuda_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: --device cuda is valid here")
    err = _cli(capsys, "analyze", "tscope_callbacks.demo.model:TinyGPT", "--input-shape", "4,8", "--device", "cuda")
    assert "argument --device: cuda: this torch sees no CUDA GPU" in err and "use meta" in err


def test_analyze_a_shape_the_model_cannot_take_names_input_shape(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    (tmp_path / "mlp.py").write_text("import torch\n\n\ndef build():\n    return torch.nn.Linear(8, 2)\n")
    err = _cli(capsys, "analyze", f"{tmp_path / 'mlp.py'}:build", "--input-shape", "4,9")
    assert "run on meta with --input-shape 4,9" in err and "Check --input-shape" in err
    assert "--precision (e.g." not in err  # not advice that cannot help


def test_analyze_a_file_that_raises_at_import(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("import torch\n\nCONFIG = {}\nWIDTH = CONFIG['width']\n")
    err = _cli(capsys, "analyze", f"{tmp_path / 'bad.py'}:build", "--input-shape", "4,8")
    assert "importing" in err and "raised KeyError: 'width' at bad.py:4 in <module>; fix that module" in err
    assert "--precision" not in err


def test_analyze_kwargs_the_factory_does_not_take(capsys: pytest.CaptureFixture[str]) -> None:
    err = _cli(capsys, "analyze", "tscope_callbacks.demo.model:TinyGPT", "--input-shape", "4,8", "--kwargs",
               '{"no_such_argument": 1}')
    assert "building the model" in err and "check --kwargs" in err


@pytest.mark.parametrize("option", ["--csv", "--plot", "--trace"])
def test_report_outputs_to_unwritable_paths(capsys: pytest.CaptureFixture[str], tmp_path: Path, option: str) -> None:
    step = _saved_step(tmp_path)
    (tmp_path / "a_file").write_text("")
    for where, why in ((tmp_path / "missing" / "out.x", "does not exist"), (tmp_path / "a_file" / "out.x",
                                                                            "is a file, not a folder"),
                       (tmp_path, "is a folder; give a file name")):
        err = _cli(capsys, "report", str(step), option, str(where))
        assert f"argument {option}" in err and why in err


def test_analyze_json_and_diff_json_and_demo_out_to_unwritable_paths(capsys: pytest.CaptureFixture[str],
                                                                      tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    bad = str(tmp_path / "a_file" / "x.json")
    err = _cli(capsys, "analyze", "tscope_callbacks.demo.model:TinyGPT", "--input-shape", "4,8", "--json", bad)
    assert "argument --json" in err
    step = _saved_step(tmp_path)
    assert "argument --json" in _cli(capsys, "diff", str(step), str(step), "--json", bad)
    err = _cli(capsys, "demo", "--out", str(tmp_path / "a_file"))
    assert "argument --out" in err and "is a file; give a folder" in err


def test_report_top_must_be_positive(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = _cli(capsys, "report", str(_saved_step(tmp_path)), "--top", "-3")
    assert "argument --top: -3 is not a whole number >= 1" in err


def test_report_on_a_device_row_missing_bandwidth_names_the_field(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    step = _saved_step(tmp_path)
    data = json.loads(step.read_text())
    data["device"] = {"name": "My GPU", "flops": {"bf16": 1e15}}
    step.write_text(json.dumps(data))
    err = _cli(capsys, "report", str(step))
    assert "the device row 'My GPU' has no bandwidth (bytes/s); add it to the file, or pass --gpu NAME" in err
    assert "unknown device" not in err.lower()


def _saved_step(tmp_path: Path) -> Path:
    """What `tscope analyze --json` writes, for a tiny MLP on the H100 roofs."""
    out = tmp_path / "step.json"
    if not out.exists():
        rep = ts.analyze_model(_mlp(), input_shape=[(4, 8)], gpu="h100")
        out.write_text(json.dumps({"profile": rep.profile.to_dict(), "device": ts.get_device_spec("h100").to_dict()}))
    return out


def test_a_3d_shape_for_token_ids_is_warned_about(capsys):
    # an embedding-first model given (batch, seq, hidden): the ids would be 3-D and every id would get its own
    # embedding row (GPT-2: 1.6 PFLOP and a 57 s step for 8,1024,768) -- said, with the shape to give instead
    import torch

    import tscope_callbacks as ts

    model = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 4))
    with pytest.warns(UserWarning, match=r"Sequential takes token ids first.*input shape \(8, 64, 128\).*e\.g\. "
                      r"8,64"):
        ts.analyze_model(model, input_shape=(8, 64, 128), gpu="h100")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the usual (batch, seq) ids: no warning
        ts.analyze_model(model, input_shape=(8, 64), gpu="h100")


def test_the_cli_prints_a_warning_as_one_line_of_its_own(tmp_path):
    # a warning under the CLI reads as the command's note: no "file.py:83: UserWarning" and no source line after it
    import subprocess
    import sys

    (tmp_path / "emb.py").write_text("import torch\n\ndef build():\n"
                                     "    return torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 4))\n")
    r = subprocess.run([sys.executable, "-m", "tscope_callbacks.cli", "analyze", "emb:build", "--input-shape", "8,64,16",
                        "--gpu", "h100", "--json", str(tmp_path / "e.json")], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if "token ids" in ln]
    assert line.startswith("tscope analyze: Sequential takes token ids first") and "UserWarning" not in r.stderr
    assert "return func(" not in r.stderr and "warnings.warn" not in r.stderr
