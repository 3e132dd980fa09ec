"""What ``tscope analyze``, ``view`` and ``report`` say to a newcomer: the class an ``hf:`` target builds and why, a
missing network in one line at once, an empty log dir, a JSON file that is no step file, and ``analyze --json`` in the
step-file version ``ts.load_step_file`` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tscope_callbacks as ts
from tscope_callbacks.cli import analyze as cli_analyze
from tscope_callbacks.cli import main

BERT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "vocab_size": 128, "max_position_embeddings": 32}
ARGS = ["--input-shape", "2,16", "--input-dtype", "long", "--gpu", "h100"]


@pytest.fixture
def transformers():
    return pytest.importorskip("transformers")


def test_hf_bert_is_the_masked_lm_and_says_why(transformers, capsys) -> None:
    assert main(["analyze", "hf:bert", "--kwargs", json.dumps(BERT), *ARGS]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("## Roofline — NVIDIA H100 SXM · BertForMaskedLM")
    assert err.strip() == ("tscope analyze: hf:bert is BertForMaskedLM (an encoder (is_decoder is false): its "
                           "masked-LM head; --kwargs '{\"is_decoder\": true}' analyses the causal-LM decoder variant)")
    assert "is_decoder" not in out  # no transformers warning about a decoder used as an encoder
    # the decoder variant when asked for
    assert main(["analyze", "hf:bert", "--kwargs", json.dumps({**BERT, "is_decoder": True}), *ARGS]) == 0
    assert "· BertLMHeadModel" in capsys.readouterr().out


@pytest.mark.parametrize(("kind", "cls"), [("bert", "BertForMaskedLM"), ("roberta", "RobertaForMaskedLM"),
                                           ("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM"),
                                           ("t5", "T5ForConditionalGeneration"), ("vit", "ViTModel")])
def test_the_head_of_each_kind(transformers, kind: str, cls: str) -> None:
    head, why = cli_analyze.hf_head(transformers, transformers.AutoConfig.for_model(kind))
    assert head.__name__ == cls and why
    named = transformers.AutoConfig.for_model("bert", architectures=["BertForSequenceClassification"])
    assert cli_analyze.hf_head(transformers, named) == (transformers.BertForSequenceClassification,
                                                        "the class its config names")


def test_no_network_is_one_line_at_once(transformers, monkeypatch, capsys) -> None:
    def no_hub(*a, **k):
        raise AssertionError("the Hub was asked although it is unreachable")

    monkeypatch.setattr(cli_analyze, "_hub_reachable", lambda timeout_s=3.0: False)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_hub)
    assert main(["analyze", "hf:google-bert/bert-base-uncased", *ARGS]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("no network: give a local config path or hf:NAME with a cached config "
                              "(hf:google-bert/bert-base-uncased is not in the cache") in err[0], err


def test_a_cached_hub_config_needs_no_network(transformers, monkeypatch, tmp_path: Path, capsys) -> None:
    from huggingface_hub import constants

    snap = tmp_path / "hub" / "models--org--tiny-bert" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc123")
    transformers.BertConfig(**BERT, architectures=["BertForMaskedLM"]).to_json_file(snap / "config.json")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(cli_analyze, "_hub_reachable", lambda timeout_s=3.0: pytest.fail("the network was probed"))
    assert main(["analyze", "hf:org/tiny-bert", *ARGS]) == 0
    out, err = capsys.readouterr()
    assert "· BertForMaskedLM" in out and "BertForMaskedLM (the class its config names)" in err


def test_analyze_json_is_the_current_step_file(transformers, tmp_path: Path, capsys) -> None:
    path = tmp_path / "bert.json"
    assert main(["analyze", "hf:bert", "--kwargs", json.dumps(BERT), *ARGS, "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["report"]["schema"] == "tscope.step_report" and data["report"]["version"] == ts.analysis.report.VERSION
    rep = ts.load_step_file(path)  # what the callbacks' step files are read with
    assert rep.device.name == "NVIDIA H100 SXM" and rep.summary.total_flops > 0
    capsys.readouterr()
    assert main(["report", str(path)]) == 0 and "BertForMaskedLM" in capsys.readouterr().out


def test_view_of_an_empty_log_dir_speaks_of_the_command_line(tmp_path: Path, capsys) -> None:
    assert main(["view", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tscope view: no tscope step files under {tmp_path}: add the callback to your Trainer")
    assert "tab" not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(("args", "says"), [
    (["--port", "99999"], "--port 99999 is not a port: pass 0-65535 (0 picks a free one)"),  # was a traceback
    (["--host", "999.1.1.1", "--port", "0"], "(pass --host with an address of this machine)"),  # said "pass --port"
])
def test_view_serve_on_a_bad_port_or_host_says_which(tmp_path: Path, capsys, args, says) -> None:
    assert main(["view", str(tmp_path), "--serve", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tscope view: ") and err.endswith(says) and len(err.splitlines()) == 1, err


def test_view_serve_on_a_port_in_use_asks_for_another(tmp_path: Path, capsys) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["view", str(tmp_path), "--serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("(pass another --port)") and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(("name", "content", "says"), [
    ("step_3.json", "{}", "is an empty JSON object, not a tscope step file"),
    ("layers_step_10.json", '{"TinyLM": {"info": {"type": "TinyLM"}, "children": {}}}',
     "is the LayerProfilerCallback's layer tree, not a step file: the RooflineCallback's step_10.json beside it "
     "is"),
    ("trace_step_4.json", '{"traceEvents": []}', "is a Chrome/Perfetto trace, not a step file"),
    ("other.json", '{"a": 1}', "is not a profiled step: a JSON object with 'a', none of a step file's"),
])
def test_report_of_a_file_that_is_no_step_file_says_what_it_is(tmp_path: Path, capsys, name, content, says) -> None:
    path = tmp_path / name
    path.write_text(content)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tscope report: {path} {says}") and len(err.splitlines()) == 1
    assert "before version 2" not in err


def test_the_dashboard_lists_an_empty_object_as_no_step_file(tmp_path: Path) -> None:
    from tscope_callbacks.dashboard import logdir as ld

    (tmp_path / "tscope").mkdir()
    (tmp_path / "tscope" / "step_3.json").write_text("{}")
    with pytest.raises(ld.StepFileError, match=r"^step_3.json is an empty JSON object, not a tscope step file"):
        ld.read_step_file(tmp_path / "tscope" / "step_3.json")


def test_report_of_a_directory_names_its_last_step_file(tmp_path: Path, capsys) -> None:
    run = tmp_path / "lightning_logs" / "version_0" / "tscope"
    run.mkdir(parents=True)
    for name in ("step_10.json", "step_200.json", "step_30.json", "layers_step_10.json", "validation_step_500.json"):
        (run / name).write_text("{}")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"tscope report: {tmp_path} is a directory: give one of its 3 step files, e.g. the last profiled "
                   f"step's: `tscope report {run / 'step_200.json'}`; `tscope view {tmp_path}` shows them all")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"tscope report: {empty} is a directory with no step file in it: give a step file (RooflineCallback writes "
        "tscope/step_<N>.json in the run's log directory)")


@pytest.mark.parametrize(("name", "content", "says"), [
    ("events.out.tfevents.1795902435.vm.20400.0", b"\x18\x00\x00\x00\x00\x00\x00\x00\xa3\x7f\x4b\x22\x09\xff",
     "is a TensorBoard event file, not a step file: `tensorboard --logdir {dir}` shows it"),
    ("weights.bin", b"\x80\x04\x95\xff\xfe", "is not a text file, so not a step file (RooflineCallback writes"),
    ("hparams.yaml", b"lr: 0.001\n", "is not JSON, so not a step file (RooflineCallback writes"),
    ("step_5.json", b"{\"profile\": ", "is not valid JSON, perhaps half-written or corrupt"),
])
def test_report_of_another_kind_of_file_says_what_it_is(tmp_path: Path, capsys, name, content, says) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tscope report: {path} {says.format(dir=tmp_path)}") and len(err.splitlines()) == 1


def test_the_directory_hints_commands_run(tmp_path: Path, capsys) -> None:
    """Both commands the hint suggests work as written, from the log dir, the run dir or the run's tscope folder
    (`tscope view <run>/tscope` said there were no step files in it)."""
    import re
    import shlex

    from profiles import a100, toy_profile

    from tscope_callbacks.api import roofline

    run = tmp_path / "logs" / "demo" / "version_0"
    (run / "tscope").mkdir(parents=True)
    for step in (10, 40):
        (run / "tscope" / f"step_{step}.json").write_text(json.dumps(roofline(toy_profile(), a100()).to_dict()))
    for where in (tmp_path / "logs", run, run / "tscope"):
        assert main(["report", str(where)]) == 2
        err = capsys.readouterr().err
        commands = re.findall(r"`tscope ([^`]+)`", err)
        assert [c.split()[0] for c in commands] == ["report", "view"], err
        for c in commands:
            assert main(shlex.split(c) + (["--out", str(tmp_path / "page.html")] if c.startswith("view") else [])) == 0, c
        out = capsys.readouterr().out
        assert "dashboard written to" in out and "blocks.0.fc" in out  # the view's page, the report's table
