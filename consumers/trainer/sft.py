"""Supervised fine-tuning on a fixed set of samples in one process (`rlbus replay sft`): the
same Trainer step as RL, over reshuffled passes of the samples."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from rlbus.config.trainer import TrainerConfig
from rlbus.consumers.trainer.memory import check_training_fits
from rlbus.consumers.trainer.policy import load_policy, save_model
from rlbus.consumers.trainer.step import StepResult, Trainer
from rlbus.schemas import TrainSample


def train_sft(
    samples: Sequence[TrainSample],
    model: str | Path,
    out: str | Path,
    cfg: TrainerConfig,
    steps: int,
    batch_size: int,
    seed: int = 0,
    on_step: Callable[[int, list[TrainSample], StepResult], None] | None = None,
) -> list[StepResult]:
    """Train `steps` optimizer steps of `batch_size` samples, then write the model to `out`;
    `on_step(step, batch, result)` follows each step."""
    if not samples:
        raise ValueError("no samples to train on")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    check_training_fits(cfg, model)  # NotEnoughMemory, with its estimate
    policy = load_policy(model, cfg.lora, cfg.device, cfg.gradient_checkpointing)
    trainer = Trainer(policy, cfg, steps)
    rng = random.Random(seed)
    order: list[int] = []
    results = []
    for step in range(steps):
        while len(order) < batch_size:
            more = list(range(len(samples)))
            rng.shuffle(more)
            order += more
        batch, order = [samples[i] for i in order[:batch_size]], order[batch_size:]
        results.append(trainer.step(batch))
        if on_step is not None:
            on_step(step, batch, results[-1])
    save_model(policy, out, model)
    return results
