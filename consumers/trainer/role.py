"""The trainer role's entry (`rlbus worker trainer`), the FSDP rank dispatch included: every
rank opens the session (sharding the model together); rank 0 consumes `batches` and hands each
step to the others, which follow until it stops. One process without FSDP is rank 0 alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from rlbus.bus import Bus
from rlbus.config.run import RunConfig
from rlbus.consumers.trainer.session import Session, open_session
from rlbus.consumers.trainer.worker import Step, TrainerWorker, run_trainer


class TrainerRole:
    def __init__(self, cfg: RunConfig, session: Session):
        self.cfg = cfg
        self.session = session
        self.leads = session.trainer.ranks.rank == 0
        """Rank 0: the bus consumer; other ranks `follow` it."""
        self._leader = None
        self.step: Step = session.trainer.step
        if cfg.trainer.parallel == "fsdp" and self.leads:
            from rlbus.consumers.trainer.fsdp import Leader

            self._leader = Leader(session.trainer)
            self.step = self._leader.step

    async def run(self, stop: asyncio.Event) -> int:
        """Rank 0: train every batch of the run until max_steps or `stop`; returns the step."""
        s, cfg = self.session, self.cfg
        async with Bus.of(cfg) as bus:
            worker = TrainerWorker(
                bus,
                self.step,
                s.checkpoints,
                s.state,
                s.hooks,
                cfg.run_id,
                cfg.orchestrator.max_off_policy_steps,
                cfg.max_steps,
                stop,
            )
            await run_trainer(bus, worker)
        return s.state.step

    def follow(self) -> None:
        """Ranks > 0: mirror rank 0's steps until it stops."""
        from rlbus.consumers.trainer.fsdp import follow

        s = self.session
        follow(s.trainer, s.hooks, s.checkpoints, s.state.step)

    def close(self) -> None:
        if self._leader is not None:
            self._leader.stop()


@contextlib.contextmanager
def trainer_role(cfg: RunConfig, resume: bool) -> Iterator[TrainerRole]:
    """Join the ranks (FSDP: torchrun sets RANK, WORLD_SIZE, MASTER_ADDR/PORT for each) and open
    the session; on leaving, rank 0 tells the followers to stop."""
    if cfg.trainer.parallel == "fsdp":
        import torch.distributed as dist

        dist.init_process_group("gloo" if cfg.trainer.device == "cpu" else "nccl")
    session = open_session(cfg.trainer, cfg.model, cfg.checkpoint_url(), cfg.max_steps, resume)
    role = TrainerRole(cfg, session)
    try:
        yield role
    finally:
        role.close()
