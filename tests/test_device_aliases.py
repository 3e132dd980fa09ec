"""Common spellings of a device resolve to its row (``devices.resolve``): a bare memory size, the vendor or memory kind
left out, the words in any order; a name that fits no row, or several, keeps the one-line error naming close ones."""

from __future__ import annotations

import pytest

from tscope_callbacks import UnknownDeviceError, get_device_spec


@pytest.mark.parametrize(("name", "canonical"), [
    ("h100-sxm5-80", "NVIDIA H100 SXM"),  # the spelling a user tried: "80" is the memory in GB
    ("h100-sxm5-80gb", "NVIDIA H100 SXM"),
    ("h100-sxm-80gb", "NVIDIA H100 SXM"),
    ("h100 80gb sxm", "NVIDIA H100 SXM"),
    ("H100 80GB SXM5", "NVIDIA H100 SXM"),
    ("NVIDIA H100 80 GB", "NVIDIA H100 SXM"),
    ("h100-pcie-80gb", "NVIDIA H100 PCIe"),
    ("h100 80gb pcie", "NVIDIA H100 PCIe"),
    ("a100-80gb", "NVIDIA A100 SXM4 80GB"),
    ("a100 80gb sxm", "NVIDIA A100 SXM4 80GB"),
    ("a100-sxm4-80", "NVIDIA A100 SXM4 80GB"),
    ("A100 40 GB SXM", "NVIDIA A100 SXM4 40GB"),
    ("pcie a100 80", "NVIDIA A100 PCIe 80GB"),
    ("h200 141gb", "NVIDIA H200"),
    ("v100-sxm2-32gb", "NVIDIA V100 SXM2"),
])
def test_common_spellings_resolve(name: str, canonical: str) -> None:
    assert get_device_spec(name).name == canonical


@pytest.mark.parametrize("name", ["h100-sxm5-40", "NVIDIA H100", "NVIDIA L40S-X", "NVIDIA GeForce RTX 4090 Laptop GPU",
                                  "a100 96gb"])
def test_unknown_names_keep_the_helpful_error(name: str) -> None:
    with pytest.raises(UnknownDeviceError) as e:
        get_device_spec(name)
    assert "Closest known names" in str(e.value) and f"unknown device {name!r}" in str(e.value)
