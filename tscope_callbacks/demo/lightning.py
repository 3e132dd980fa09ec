"""The demo's LightningModule, synthetic-token DataModule and NaN injector (also used by ``configs/demo.yaml``)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from tscope_callbacks.demo.model import GPTConfig, TinyGPT

__all__ = ["DemoLM", "NaNInjector", "RandomTokenData", "GPU_DEMO", "CPU_DEMO"]

#: the demo's sizes: a CPU-sized TinyGPT (under a minute), and on a GPU a GPT-2-124M-shaped model (12 x 768, vocab
#: 50257, 1024 tokens, batch 8, bf16, fused AdamW) whose report shows real findings (e.g. the unpadded vocabulary)
CPU_DEMO = {"model": {}, "data": {}, "precision": "32-true"}
GPU_DEMO = {"model": {"vocab_size": 50257, "seq_len": 1024, "d_model": 768, "n_layer": 12, "n_head": 12, "lr": 3e-4,
                      "fused": True},
            "data": {"vocab_size": 50257, "seq_len": 1024, "batch_size": 8, "num_samples": 8 * 400},
            "precision": "bf16-mixed"}



class DemoLM(pl.LightningModule):
    """TinyGPT as a LightningModule. Hyper-parameters are plain ints so LightningCLI can set them."""

    def __init__(self, vocab_size: int = 512, seq_len: int = 64, d_model: int = 128, n_layer: int = 2,
                 n_head: int = 4, lr: float = 3e-3, fused: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.cfg = GPTConfig(vocab_size=vocab_size, seq_len=seq_len, d_model=d_model, n_layer=n_layer, n_head=n_head)
        self.model = TinyGPT(self.cfg)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val/loss", torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, fused=bool(self.hparams.fused) or None)


class RandomTokenData(pl.LightningDataModule):
    """Synthetic language-model data: a fixed random token stream with a learnable pattern (next = prev + 1)."""

    def __init__(self, vocab_size: int = 512, seq_len: int = 64, batch_size: int = 16, num_samples: int = 4096,
                 seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()

    def _dataset(self, n: int, seed: int) -> TensorDataset:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, self.hparams.vocab_size, (n, 1), generator=g)
        seq = (start + torch.arange(self.hparams.seq_len + 1)) % self.hparams.vocab_size
        noise = torch.rand(seq.shape, generator=g) < 0.1
        seq = torch.where(noise, torch.randint(0, self.hparams.vocab_size, seq.shape, generator=g), seq)
        return TensorDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self._dataset(self.hparams.num_samples, self.hparams.seed),
                          batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self._dataset(256, self.hparams.seed + 1), batch_size=self.hparams.batch_size)


class NaNInjector(pl.Callback):
    """Demo only: the batch of optimizer step ``step`` is a poisoned one. Whenever that batch goes through the model
    (at that step, and again when the NaN guard replays the step to name the layer, which on a GPU happens a few steps
    later), ``layer``'s forward output is NaN, as a bad sample would make it. The batch is recognised by identity on
    the host (the guard's replay runs the same tensors): no device work, no host sync. The hooks go when the fit
    ends."""

    def __init__(self, step: int, layer: str = "model.blocks.1.mlp.fc") -> None:
        self.step, self.layer = step, layer
        self._poison: torch.Tensor | None = None  #: the poisoned batch's input tensor
        self._hit = False  #: the running forward's input is that tensor
        self._handles: list[Any] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and self._poison is None:
            self._poison = batch[0]
            self._handles = [pl_module.model.register_forward_pre_hook(self._see),
                             pl_module.get_submodule(self.layer).register_forward_hook(self._inject)]

    def _see(self, module: torch.nn.Module, args: tuple) -> None:
        self._hit = bool(args) and args[0] is self._poison

    def _inject(self, module: torch.nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        return out * float("nan") if self._hit else None

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for h in self._handles:
            h.remove()
        self._handles, self._poison, self._hit = [], None, False
