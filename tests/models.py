"""Tiny shared test models: a small transformer LM as a LightningModule, on synthetic token data.

Kept deliberately small (a few ms per CPU step) so tests with a real ``Trainer`` stay fast. Add new helpers here
without renaming the existing ones: several test files import them.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from tscope_callbacks.demo.model import GPTConfig, TinyGPT

__all__ = ["TINY_CFG", "TinyLM", "token_dataloader"]

# 2 blocks, d_model 32: module paths "model.blocks.0.mlp", "model.blocks.1.attn.qkv", ...
TINY_CFG = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layer=2, n_head=2)


def token_dataloader(cfg: GPTConfig = TINY_CFG, *, batch_size: int = 4, n_batches: int = 64, seed: int = 0,
                     shuffle: bool = False) -> DataLoader:
    """Random (inputs, targets) token batches; deterministic for a given seed."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, cfg.vocab_size, (batch_size * n_batches, cfg.seq_len + 1), generator=g)
    ds = TensorDataset(data[:, :-1].contiguous(), data[:, 1:].contiguous())
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, num_workers=0)


class TinyLM(pl.LightningModule):
    """``TinyGPT`` language model trained with next-token cross-entropy.

    ``optimizer``: "sgd" (momentum 0.9), "adamw" (weight decay 0.1) or "adam"; "sgd-fused" / "adamw-fused" use the
    fused implementations (the ones with a ``found_inf`` path, as on a GPU with ``fused=True``). The transformer is ``self.model``, so
    module paths seen from the LightningModule are prefixed with ``model.`` (e.g. ``model.blocks.1.mlp``).
    """

    def __init__(self, cfg: GPTConfig = TINY_CFG, *, optimizer: str = "sgd", lr: float = 1e-2,
                 n_batches: int = 64, batch_size: int = 4) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = TinyGPT(cfg)
        self.optimizer_name = optimizer
        self.lr = lr
        self.n_batches = n_batches
        self.batch_size = batch_size

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def compute_loss(self, batch) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self.compute_loss(batch)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        name, _, fused = self.optimizer_name.partition("-")
        kw = {"fused": True} if fused == "fused" else {}
        if name == "sgd":
            return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, **kw)
        if name == "adamw":
            return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.1, **kw)
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        raise ValueError(f"unknown optimizer {self.optimizer_name!r}")

    def train_dataloader(self) -> DataLoader:
        return token_dataloader(self.cfg, batch_size=self.batch_size, n_batches=self.n_batches)
