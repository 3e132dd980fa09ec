"""Device roof table, name resolution, precision handling, CPU auto roof and `tscope specs`."""

from __future__ import annotations

import importlib
import json
import math
import re

import pytest
import torch

from tscope_callbacks.cli import main
from tscope_callbacks.devices.precision import PRECISIONS, normalize_precision, precision_for_dtype
from tscope_callbacks.devices.resolve import get_device_spec, list_specs
from tscope_callbacks.devices.spec import AmbiguousDeviceError, DeviceSpec, SpecFileError, UnknownDeviceError
from tscope_callbacks.devices.table import SpecTable, builtin_table, default_table_path

# the module, not the ``ts.calibrate`` function the package exports under the same name
cal = importlib.import_module("tscope_callbacks.devices.calibrate")


@pytest.fixture
def fp32_precision():
    """Restore torch's float32 matmul precision after the test."""
    prev = torch.get_float32_matmul_precision()
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)


# ---------------- datasheet numbers ----------------
@pytest.mark.parametrize("name, prec, flops, bandwidth", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12, 3.35e12),
    ("NVIDIA H100 80GB HBM3", "fp8", 1978.9e12, 3.35e12),
    ("NVIDIA H100 80GB HBM3", "tf32", 494.7e12, 3.35e12),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312e12, 2.039e12),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156e12, 2.039e12),
    ("NVIDIA A100-SXM4-40GB", "bf16", 312e12, 1.555e12),
    ("NVIDIA H100 PCIe", "bf16", 756e12, 2.0e12),
    ("NVIDIA H100 NVL", "bf16", 835.5e12, 3.9e12),
    ("NVIDIA H200", "bf16", 989.4e12, 4.8e12),
    ("NVIDIA L40S", "bf16", 362.05e12, 864e9),
    ("NVIDIA L4", "bf16", 121e12, 300e9),
    ("AMD Instinct MI300X", "bf16", 1307.4e12, 5.3e12),  # dense (2614.9 is with sparsity)
    ("AMD Instinct MI300X", "fp8", 2614.9e12, 5.3e12),
    ("AMD Instinct MI250X", "bf16", 191.5e12, 1.6384e12),  # one GCD = half the package
])
def test_datasheet_values(name, prec, flops, bandwidth):
    spec = get_device_spec(name)
    assert spec.flops[prec] == pytest.approx(flops)
    assert spec.bandwidth == pytest.approx(bandwidth)


def test_vector_rates_and_fp64():
    h100 = get_device_spec("h100")
    assert h100.peak_flops("fp32", matrix=False) == pytest.approx(66.9e12)
    assert h100.peak_flops("fp64") == pytest.approx(66.9e12)  # FP64 tensor core
    assert h100.peak_flops("fp64", matrix=False) == pytest.approx(33.5e12)
    # non-tensor fp16/bf16 (the H100 whitepaper's Table 3: 133.8 TFLOPS, 2x fp32: packed half2 math)
    assert h100.peak_flops("bf16", matrix=False) == pytest.approx(133.8e12)
    a100 = get_device_spec("a100")
    assert a100.peak_flops("fp32", matrix=False) == pytest.approx(19.5e12)
    # A100 whitepaper Table 1: non-tensor FP16 78, BF16 39 TFLOPS
    assert (a100.peak_flops("fp16", matrix=False), a100.peak_flops("bf16", matrix=False)) == (78e12, 39e12)
    # a row without a 16-bit vector rate falls back to the fp32 vector units
    assert get_device_spec("l4").peak_flops("bf16", matrix=False) == get_device_spec("l4").peak_flops(
        "fp32", matrix=False)


# ---------------- name resolution ----------------
@pytest.mark.parametrize("name, canonical", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
    ("NVIDIA H200", "NVIDIA H200"),
    ("NVIDIA L40S", "NVIDIA L40S"),
    ("NVIDIA L4", "NVIDIA L4"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM4 80GB"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 SXM4 40GB"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe 80GB"),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 PCIe 40GB"),
    ("Tesla V100S-PCIE-32GB", "NVIDIA V100S PCIe"),
    ("Tesla V100-SXM2-16GB", "NVIDIA V100 SXM2"),
    ("Tesla V100-PCIE-32GB", "NVIDIA V100 PCIe"),
    ("Tesla T4", "NVIDIA T4"),
    ("NVIDIA A10G", "NVIDIA A10G"),
    ("NVIDIA A10", "NVIDIA A10"),
    ("NVIDIA GeForce GTX 1650 Ti", "NVIDIA GeForce GTX 1650 Ti (laptop)"),
    ("NVIDIA GeForce GTX 1650 Ti with Max-Q Design", "NVIDIA GeForce GTX 1650 Ti Max-Q (laptop)"),
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
    ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090"),
    ("AMD Instinct MI300X", "AMD Instinct MI300X"),
    ("AMD Instinct MI250X", "AMD Instinct MI250X (per GCD)"),
    ("NVIDIA GH200 480GB", "NVIDIA GH200 480GB"),
    ("NVIDIA B200", "NVIDIA B200"),
    # short forms and aliases
    ("h100", "NVIDIA H100 SXM"),
    ("a100-80gb", "NVIDIA A100 SXM4 80GB"),
    ("a100", "NVIDIA A100 SXM4 80GB"),
    ("4090", "NVIDIA GeForce RTX 4090"),
    ("l40s", "NVIDIA L40S"),
    ("mi300x", "AMD Instinct MI300X"),
    ("h100-sxm", "NVIDIA H100 SXM"),
    # case, separators, vendor prefix dropped, patterns
    ("nvidia l40s", "NVIDIA L40S"),
    ("  NVIDIA   L40S ", "NVIDIA L40S"),
    ("H100 PCIe", "NVIDIA H100 PCIe"),
    ("A100_SXM4_40GB", "NVIDIA A100 SXM4 40GB"),
    ("NVIDIA H100 SXM5 80GB HBM3", "NVIDIA H100 SXM"),
    ("AMD Instinct MI250X / MI250", "AMD Instinct MI250X (per GCD)"),
])
def test_names_resolve(name, canonical):
    assert get_device_spec(name).name == canonical


def test_l40s_is_not_l4():
    # Lightning's ThroughputMonitor finds "l4" inside "nvidia l40s" by substring and reports an L4.
    l40s, l4 = get_device_spec("NVIDIA L40S"), get_device_spec("NVIDIA L4")
    assert l40s.name != l4.name
    assert l40s.flops["bf16"] == pytest.approx(362.05e12) and l4.flops["bf16"] == pytest.approx(121e12)
    with pytest.raises(UnknownDeviceError):  # a longer unknown name is not read as a known prefix
        get_device_spec("NVIDIA L40S-X")
    with pytest.raises(UnknownDeviceError):
        get_device_spec("NVIDIA GeForce RTX 4090 Laptop GPU")


def test_every_real_name_round_trips_and_table_is_unambiguous():
    table = builtin_table()
    assert table.ambiguous_keys() == {}
    for spec in table.specs:
        for n in (spec.name, *spec.match, *spec.aliases, spec.name.upper(), spec.name.lower()):
            assert get_device_spec(n) is spec, n


def test_ambiguity_raises_never_picks():
    a = DeviceSpec("Chip A", {"bf16": 1e14}, 1e12, aliases=("chip",), patterns=("^chip x\\d$",))
    b = DeviceSpec("Chip B", {"bf16": 2e14}, 1e12, aliases=("chip",), patterns=("^chip x[0-9]$",))
    t = SpecTable([a, b])
    assert "chip" in t.ambiguous_keys()
    with pytest.raises(AmbiguousDeviceError, match="ambiguous") as ei:
        t.lookup("CHIP")
    assert set(ei.value.candidates) == {"Chip A", "Chip B"}
    with pytest.raises(AmbiguousDeviceError):
        t.lookup("chip x7")
    assert t.lookup("Chip A") is a


def test_unknown_name_message():
    with pytest.raises(UnknownDeviceError) as ei:
        get_device_spec("NVIDIA H100")  # not a real device name: which H100?
    err = ei.value
    assert isinstance(err, ValueError)
    assert 3 <= len(err.candidates) <= 5
    assert {"NVIDIA H100 SXM", "NVIDIA H100 PCIe", "NVIDIA H100 NVL"} <= set(err.candidates)
    msg = str(err)
    assert "NVIDIA H100 SXM" in msg and "gpu_specs.json" in msg and "DeviceSpec(" in msg
    assert '"bandwidth"' in msg and '"flops"' in msg  # the minimal row schema, inline
    with pytest.raises(UnknownDeviceError) as ei:
        get_device_spec("Radeon Potato 9000")
    assert len(ei.value.candidates) >= 3


# ---------------- JSON rows ----------------
ROW = {"name": "My GPU", "flops": {"bf16": 1.0e14, "float32": 2.0e13}, "bandwidth": 1.0e12}


def test_json_path_inputs(tmp_path):
    one = tmp_path / "one.json"
    one.write_text(json.dumps(ROW))
    spec = get_device_spec(str(one))
    assert spec.name == "My GPU" and spec.flops == {"bf16": 1.0e14, "fp32": 2.0e13} and spec.bandwidth == 1e12
    assert spec.ridge("bf16") == pytest.approx(100.0)
    assert get_device_spec(one).name == "My GPU"  # PathLike
    lst = tmp_path / "list.json"
    lst.write_text(json.dumps([ROW]))
    assert get_device_spec(str(lst)).name == "My GPU"
    many = tmp_path / "many.json"
    rows = [dict(ROW, aliases=["mine"]), dict(ROW, name="NVIDIA L40S", flops={"bf16": 5e14}, source="override")]
    many.write_text(json.dumps({"devices": rows}))
    with pytest.raises(SpecFileError, match="2 rows"):
        get_device_spec(str(many))
    assert get_device_spec("mine", table=many).name == "My GPU"
    assert get_device_spec("NVIDIA L40S", table=str(many)).source == "override"  # user rows first
    assert get_device_spec("h100", table=many).name == "NVIDIA H100 SXM"  # then the built-in table
    assert list_specs(table=many)[0].name == "My GPU"


@pytest.mark.parametrize("content, expected", [
    ('{"name": "X", "flops": {"bf16": 1e14}', ["bad.json", "invalid JSON", "line"]),
    ('[{"name": "Good", "flops": {"bf16": 1e14}, "bandwidth": 1e12}, {"name": "Broken", "flops": {"bf16": 1e14}}]',
     ["bad.json", "row 1", "'Broken'", "'bandwidth'", "missing"]),
    ('[{"flops": {"bf16": 1e14}, "bandwidth": 1e12}]', ["row 0", "'name'"]),
    ('{"name": "X", "flops": {"bf16": -1}, "bandwidth": 1e12}', ["'X'", "'flops.bf16'", "positive"]),
    ('{"name": "X", "flops": {"bf16": 1e14}, "bandwidth": "fast"}', ["'X'", "'bandwidth'"]),
    ('{"name": "X", "flops": {"bf16": 1e14}, "bandwith": 1e12}', ["'X'", "'bandwidth'", "missing"]),
    ('{"name": "X", "flops": {"bf16": 1e14}, "bandwidth": 1e12, "l2bytes": 5}', ["'X'", "'l2bytes'", "not a known"]),
    ('{"name": "X", "flops": {"bf17": 1e14}, "bandwidth": 1e12}', ["'X'", "bf17"]),
    ('{"name": "X", "flops": {"bf16": 1e14}, "bandwidth": 1e12, "patterns": ["(unclosed"]}', ["'X'", "'patterns'"]),
    ('"just a string"', ["bad.json", "expected a row object"]),
])
def test_malformed_json_errors(tmp_path, content, expected):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(SpecFileError) as ei:
        get_device_spec(str(path))
    for piece in expected:
        assert piece in str(ei.value), (piece, str(ei.value))


def test_missing_json_file():
    with pytest.raises(SpecFileError, match="not found"):
        get_device_spec("/nonexistent/dir/gpu.json")


def test_devicespec_passthrough_and_validation():
    spec = DeviceSpec("Mine", {"float16": 1e14, torch.float32: 1e13}, 5e11)
    assert get_device_spec(spec) is spec
    assert spec.flops == {"fp16": 1e14, "fp32": 1e13}
    with pytest.raises(ValueError, match="bandwidth"):
        DeviceSpec("Bad", {"fp32": 1e13}, 0)
    with pytest.raises(ValueError, match="unknown precision"):
        DeviceSpec("Bad", {"fp33": 1e13}, 1e12)
    back = DeviceSpec.from_dict(json.loads(json.dumps(get_device_spec("l40s").to_dict())))
    assert back.flops == get_device_spec("l40s").flops and back.match == ("NVIDIA L40S",)


# ---------------- the whole table ----------------
def test_table_rows_complete_and_sane():
    specs = list_specs()
    assert len(specs) >= 30
    raw = json.loads(default_table_path().read_text())["devices"]
    assert len(raw) == len(specs)
    for row, s in zip(raw, specs):
        assert row.get("source") and row.get("vendor") in ("nvidia", "amd"), s.name
        assert row.get("match") or row.get("patterns"), s.name
        assert "fp32" in s.flops and "fp32" in s.vector_flops and "fp64" in s.vector_flops, s.name
        assert all(v > 0 and math.isfinite(v) for v in (*s.flops.values(), *s.vector_flops.values())), s.name
        assert 50e9 <= s.bandwidth <= 20e12, s.name
        assert s.l2_bytes is None or 2**20 <= s.l2_bytes <= 512 * 2**20, s.name
        vec32 = s.vector_flops["fp32"]
        for p in ("bf16", "fp16", "tf32", "fp8", "int8"):
            if p in s.flops:
                assert s.flops[p] >= vec32, (s.name, p)
        assert s.flops["fp32"] >= vec32 and s.flops["fp64"] >= s.vector_flops["fp64"], s.name
        if "fp8" in s.flops:
            assert s.flops["fp8"] >= s.flops["bf16"], s.name
        assert s.flops["fp32"] < 1e15 and s.flops.get("bf16", 0) < 5e15, s.name  # dense, not sparse, not per-node


# ---------------- precision handling ----------------
def test_tf32_switch(fp32_precision):
    h100, v100 = get_device_spec("h100"), get_device_spec("v100")
    torch.set_float32_matmul_precision("highest")
    assert h100.peak_flops("fp32") == pytest.approx(66.9e12)
    assert h100.effective_precision("fp32") == "fp32"
    torch.set_float32_matmul_precision("high")
    assert h100.peak_flops("fp32") == pytest.approx(494.7e12)
    assert h100.peak_flops(torch.float32) == pytest.approx(494.7e12)
    assert h100.effective_precision("32-true") == "tf32"
    assert h100.peak_flops("fp32", matrix=False) == pytest.approx(66.9e12)  # vector ops never use TF32
    assert h100.peak_flops("fp32", allow_tf32=False) == pytest.approx(66.9e12)
    assert v100.peak_flops("fp32") == pytest.approx(15.7e12)  # no TF32 on Volta
    torch.set_float32_matmul_precision("medium")
    assert h100.ridge("fp32") == pytest.approx(494.7e12 / 3.35e12)
    torch.set_float32_matmul_precision("highest")
    assert h100.peak_flops("tf32") == pytest.approx(494.7e12)  # explicit tf32 always
    assert h100.peak_flops("fp32", allow_tf32=True) == pytest.approx(494.7e12)


def test_fallbacks():
    a100, v100, t4 = get_device_spec("a100"), get_device_spec("v100"), get_device_spec("t4")
    assert a100.peak_flops("fp8") == pytest.approx(312e12) and a100.effective_precision("fp8") == "fp16"
    assert v100.peak_flops("bf16") == pytest.approx(15.7e12)  # no bf16 units: fp32 rate
    assert v100.peak_flops("int8") == pytest.approx(125e12)  # no int8 figure: fp16
    assert v100.peak_flops("tf32") == pytest.approx(15.7e12)
    assert t4.peak_flops("int8") == pytest.approx(130e12)
    only16 = DeviceSpec("Only bf16", {"bf16": 1e14}, 1e12)
    assert only16.peak_flops("fp16") == 1e14
    with pytest.raises(ValueError, match="fp64"):
        only16.peak_flops("fp64")


def test_ridge_arithmetic():
    h100 = get_device_spec("NVIDIA H100 80GB HBM3")
    assert h100.ridge("bf16") == pytest.approx(989.4e12 / 3.35e12)
    assert h100.ridge("bf16-mixed") == pytest.approx(295.34, rel=1e-4)
    assert h100.ridge("fp32", matrix=False) == pytest.approx(66.9e12 / 3.35e12)
    l4 = get_device_spec("l4")
    assert l4.ridge("fp16") == pytest.approx(121e12 / 300e9)


@pytest.mark.parametrize("given, canon", [
    ("fp32", "fp32"), ("float32", "fp32"), ("32", "fp32"), ("32-true", "fp32"), (32, "fp32"), ("FP32", "fp32"),
    ("tf32", "tf32"), ("fp16", "fp16"), ("float16", "fp16"), ("half", "fp16"), ("16", "fp16"),
    ("16-mixed", "fp16"), ("16-true", "fp16"), ("bf16", "bf16"), ("bfloat16", "bf16"), ("bf16-mixed", "bf16"),
    ("bf16-true", "bf16"), ("fp64", "fp64"), ("64", "fp64"), ("64-true", "fp64"), ("double", "fp64"),
    ("fp8", "fp8"), ("float8_e4m3fn", "fp8"), ("float8_e5m2", "fp8"), ("int8", "int8"),
    (torch.float32, "fp32"), (torch.float16, "fp16"), (torch.bfloat16, "bf16"), (torch.float64, "fp64"),
    (torch.float8_e4m3fn, "fp8"), (torch.int8, "int8"), ("torch.bfloat16", "bf16"),
])
def test_normalize_precision(given, canon):
    assert normalize_precision(given) == canon
    assert canon in PRECISIONS


@pytest.mark.parametrize("bad", ["fp33", "mixed", "", "int4", torch.int64])
def test_normalize_precision_unknown(bad):
    with pytest.raises(ValueError, match="accepted:.*bf16-mixed"):
        normalize_precision(bad)


@pytest.mark.parametrize("dtype, prec", [
    ("float32", "fp32"), ("bfloat16", "bf16"), ("float16", "fp16"), ("float64", "fp64"), ("int8", "int8"),
    ("float8_e4m3fn", "fp8"), ("float8_e5m2", "fp8"), ("int64", "fp32"), ("bool", "fp32"), ("", "fp32"),
    ("complex128", "fp64"), ("torch.bfloat16", "bf16"),
])
def test_precision_for_dtype(dtype, prec):
    assert precision_for_dtype(dtype) == prec


def test_precision_for_dtype_strict():
    with pytest.raises(ValueError):
        precision_for_dtype("int64", default=None)
    with pytest.raises(ValueError):
        precision_for_dtype("float128")


# ---------------- "auto" ----------------
def test_auto_cpu_measures_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("TSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cal, "_load_per_cpu", lambda *a: 0.0)  # a busy test machine must not skip the cache
    spec = get_device_spec("auto", budget_s=0.15)
    assert spec.measured and re.fullmatch(r"CPU \(.+, \d+ threads?\)", spec.name), spec.name
    assert spec.flops["fp32"] > 0 and spec.flops["bf16"] > 0 and spec.bandwidth > 0
    assert (tmp_path / "cpu_roofs.json").is_file()

    def boom(**kw):
        raise AssertionError("measured again instead of using the cache")

    monkeypatch.setattr(cal, "measure_cpu", boom)
    again = get_device_spec("auto", budget_s=0.15)
    assert again.flops == spec.flops and again.bandwidth == spec.bandwidth and again.measured


def test_auto_cpu_corrupted_cache_is_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("TSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (tmp_path / "cpu_roofs.json").write_text("{not json")
    fake = DeviceSpec("CPU (fake, 1 threads)", {"fp32": 1e11, "bf16": 5e10}, 1e10, measured=True)
    monkeypatch.setattr(cal, "measure_cpu", lambda **kw: fake)
    assert get_device_spec("auto", budget_s=0.1).flops == fake.flops
    data = json.loads((tmp_path / "cpu_roofs.json").read_text())
    assert data["version"] == 1 and len(data["entries"]) == 1


def test_cpu_names_the_measured_cpu_roof_on_any_machine(tmp_path, monkeypatch):
    # gpu="cpu" is what a user writes for torch.device("cpu"); it used to say 'unknown device cpu, closest: P100'
    monkeypatch.setenv("TSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA host: "cpu" still means the CPU
    fake = DeviceSpec("CPU (fake, 1 threads)", {"fp32": 1e11, "bf16": 5e10}, 1e10, measured=True)
    monkeypatch.setattr(cal, "measure_cpu", lambda **kw: fake)
    assert get_device_spec("cpu", budget_s=0.1).flops == fake.flops
    assert get_device_spec(" CPU ", budget_s=0.1).name == get_device_spec(torch.device("cpu")).name == fake.name


def test_auto_on_cuda_uses_device_name(monkeypatch, tmp_path):
    monkeypatch.setenv("TSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA L40S")
    assert get_device_spec("auto").name == "NVIDIA L40S"
    assert get_device_spec(torch.device("cuda", 0)).name == "NVIDIA L40S"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA Z9000")
    with pytest.raises(UnknownDeviceError, match="current GPU"):
        get_device_spec("auto")


# ---------------- CLI ----------------
def test_cli_specs_table(capsys):
    assert main(["specs"]) == 0
    out = capsys.readouterr().out
    assert "bf16 TFLOP/s" in out and "ridge bf16 FLOP/B" in out and "L2 MiB" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("NVIDIA H100 SXM "))
    assert "989.4" in line and "3.35" in line and "295" in line and "50" in line
    assert f"{len(list_specs())} devices" in out


def test_cli_specs_one(capsys):
    assert main(["specs", "NVIDIA L40S"]) == 0
    out = capsys.readouterr().out
    for piece in ("NVIDIA L40S", "362.05", "733", "864 GB/s", "l40s", "datasheet", "fp8", "int8", "ridge"):
        assert piece in out, piece
    assert main(["specs", "a100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bandwidth"] == pytest.approx(2.039e12)


def test_cli_specs_unknown_exits_2(capsys):
    assert main(["specs", "NVIDIA Z9000"]) == 2
    captured = capsys.readouterr()
    assert "unknown device 'NVIDIA Z9000'" in captured.err and "gpu_specs.json" in captured.err
    assert "Traceback" not in captured.err + captured.out
