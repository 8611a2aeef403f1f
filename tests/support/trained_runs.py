"""A finished run of the reverse_text example on a fresh tiny model, whose weight versions are in
its store: what `rlbus model export` and stored-version teachers read
(tests/trainer/test_model_export.py, tests/launch/test_teachers.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from rlbus.bus import EmbeddedBroker
from rlbus.config import Settings
from rlbus.config.trainer import LoraConfig
from rlbus.consumers.inference.api import Arch
from rlbus.consumers.inference.model_init import init_model
from support.in_process import run_in_process
from support.isolated import module_settings
from support.runs import EXAMPLE, run_config

STEPS = 2
"""Steps of a stored run: versions 0 (its start), 1 and 2."""


@dataclass(frozen=True)
class Run:
    settings: Settings
    base: Path
    checkpoints: Path

    @property
    def run_id(self) -> str:
        return self.settings.run_id

    @property
    def store(self) -> str:
        return self.settings.store.url

    def ref(self, version: int | str) -> str:
        return f"run:{self.run_id}@{version}"


def start_run(broker: EmbeddedBroker, tmp: Path, arch: Arch, lora: bool) -> Run:
    """A two-step run of the reverse_text example on a fresh tiny model, in its own store."""
    settings = module_settings(broker, tmp)
    base = tmp / f"tiny-{arch}"
    init_model(base, arch=arch, seed=0)
    cfg = run_config(settings, base, tmp, eval_every=0, drop_zero_signal=False)
    trainer = cfg.trainer
    if lora:
        trainer = trainer.model_copy(
            update={"lora": LoraConfig(enabled=True, publish="adapter", rank=4)}
        )
        # LoRA's B starts at zero: a rate that moves it visibly in two steps.
        trainer = trainer.model_copy(
            update={"optim": trainer.optim.model_copy(update={"lr": 5e-2})}
        )
    cfg = cfg.model_copy(update={"max_steps": STEPS, "trainer": trainer})
    asyncio.run(run_in_process(cfg, EXAMPLE, timeout_s=240))
    return Run(settings, base, tmp / "ckpt")
