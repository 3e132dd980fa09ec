"""Models for ``tscope analyze MODULE:CLASS`` tests (importable as ``cli_models`` from the tests directory).

Each carries its expected forward FLOPs (a multiply-add is 2 FLOPs; bias epilogues are not counted).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SmallConvNet"]


class SmallConvNet(nn.Module):
    """conv 3->8 (3x3, padding 1) -> ReLU -> global average pool -> linear 8->10."""

    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.act(self.conv(x))).flatten(1))

    def expected_flops(self, n: int, h: int, w: int) -> dict[str, int]:
        """Forward matmul-family FLOPs per layer for an (n, 3, h, w) input."""
        c = self.conv.out_channels
        return {"conv": 2 * n * c * h * w * 3 * 3 * 3, "fc": 2 * n * c * self.fc.out_features}
