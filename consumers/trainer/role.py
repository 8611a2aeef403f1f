"""The trainer role (`rlbus worker trainer`), the FSDP rank dispatch included: every rank opens
the session (sharding the model together); rank 0 consumes `batches` and hands each step to the
others, which follow until it stops. One process without FSDP is rank 0 alone.

With `trainer.parallel = "fsdp"` or `"torchtitan"` and no torchrun around it, the trainer
process is rank 0 and starts ranks 1..N-1 itself (torch.multiprocessing, spawn). They die with
it, ignore Ctrl-C and SIGTERM (rank 0 takes those, finishes its step and tells them to stop),
and a rank that fails ends the others. Under torchrun, torchrun's ranks are used as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Iterator

import torch
from torch.multiprocessing.spawn import ProcessContext, start_processes

from rlbus.bus import Bus, free_port
from rlbus.bus.role import RoleSummary
from rlbus.bus.waiting import unless_stopped
from rlbus.config.runs import RunConfig
from rlbus.consumers.model_size import LOADING
from rlbus.consumers.trainer.batch_trainer import GROUP, BatchTrainer, Step, train_batches
from rlbus.consumers.trainer.session import Session, open_session
from rlbus.schemas import group_of


class TrainerRank:
    """This process's rank of the trainer, its session open."""

    def __init__(self, cfg: RunConfig, session: Session):
        self.cfg = cfg
        self.session = session
        self.leads = session.trainer.ranks.rank == 0
        """Rank 0: the bus consumer; other ranks `follow` it."""
        self._leader = None
        self.step: Step = session.trainer.step
        self.hooks = session.hooks
        if cfg.trainer.distributed and self.leads:
            from rlbus.consumers.trainer.fsdp import Leader

            self._leader = Leader(session.trainer)
            self.step = self._leader.step
            self.hooks = self._leader.hooks(session.hooks)

    async def run(self, stop: asyncio.Event) -> int:
        """Rank 0: train every batch of the run until max_steps or `stop`; returns the step."""
        s, cfg = self.session, self.cfg
        async with Bus.of(cfg) as bus:
            trainer = BatchTrainer(
                bus,
                self.step,
                s.checkpoints,
                s.state,
                self.hooks,
                cfg.run_id,
                cfg.orchestrator.max_off_policy_steps,
                cfg.max_steps,
                stop,
                s.checkpoint_every,
                s.incarnation,
            )
            await train_batches(bus, trainer)
        return s.state.step

    def follow(self) -> None:
        """Ranks > 0: mirror rank 0's steps until it stops."""
        from rlbus.consumers.trainer.fsdp import follow

        follow(self.session.trainer, self.session.hooks)

    def close(self) -> None:
        if self._leader is not None:
            self._leader.stop()


log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def _backend(cfg: RunConfig) -> str:
    return "gloo" if cfg.trainer.device == "cpu" else "nccl"


def _use_rank_device(cfg: RunConfig) -> None:
    """With nccl, this rank's GPU (LOCAL_RANK) as the calling thread's CUDA device."""
    if cfg.trainer.distributed and _backend(cfg) == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def _check_ranks(cfg: RunConfig, ranks: int) -> None:
    """Say why the ranks cannot run here, before any starts."""
    import torch.distributed as dist

    if not dist.is_available():
        raise SystemExit(
            f"trainer.parallel = {cfg.trainer.parallel!r}: this torch build has no "
            "torch.distributed"
        )
    if _backend(cfg) == "nccl":
        gpus = torch.cuda.device_count()
        if gpus < ranks:
            raise SystemExit(
                f"trainer.ranks = {ranks} on trainer.device = {cfg.trainer.device!r} needs "
                f"{ranks} GPUs (nccl: one per rank); torch sees {gpus}. Use fewer ranks, or "
                "trainer.device = 'cpu' (gloo)"
            )


def _follower(index: int, cfg: RunConfig, resume: bool, world: int, port: int) -> None:
    """Rank index + 1, started by rank 0: mirror its steps until it says stop."""
    # Killed with rank 0 however it dies; its signals are rank 0's to handle (a follower that
    # left in the middle of a collective would hang the others).
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    rank = index + 1
    _join(cfg, rank, world, port)
    with trainer_rank(cfg, resume) as part:
        part.follow()


def _join(cfg: RunConfig, rank: int, world: int, port: int) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


@contextlib.contextmanager
def _ranks(cfg: RunConfig, resume: bool) -> Iterator[None]:
    """FSDP's process group: torchrun's ranks (RANK is set), or rank 0 here and the others
    started here; on leaving, the started ranks are waited for (or ended, after a failure)."""
    import torch.distributed as dist

    world = cfg.trainer.ranks
    started: ProcessContext | None = None
    if "RANK" in os.environ:
        torchrun = int(os.environ.get("WORLD_SIZE", "1"))
        if world not in (1, torchrun):
            raise SystemExit(
                f"trainer.ranks = {world}, but torchrun started {torchrun} ranks (WORLD_SIZE): "
                "leave trainer.ranks at 1 under torchrun, or run without torchrun"
            )
        world = torchrun
    else:
        _check_ranks(cfg, world)
        port = free_port()
        _join(cfg, 0, world, port)
        if world > 1:
            started = start_processes(
                _follower,
                args=(cfg, resume, world, port),
                nprocs=world - 1,
                join=False,
                start_method="spawn",
            )
    if os.environ["RANK"] == "0":
        kind = "FSDP" if cfg.trainer.parallel == "fsdp" else "torchtitan (FSDP2)"
        log.info("%s: %d ranks (%s)", kind, world, _backend(cfg))
    _use_rank_device(cfg)
    dist.init_process_group(_backend(cfg))
    failed = True
    try:
        yield
        failed = False
    finally:
        if started is not None:
            if failed:  # followers may wait in a collective that will never come
                for process in started.processes:
                    process.kill()
                with contextlib.suppress(Exception):  # this failure is the one to report
                    while not started.join():
                        pass
            else:
                while not started.join():  # raises, naming the rank, if one failed
                    pass


def _joined(cfg: RunConfig, resume: bool) -> contextlib.AbstractContextManager[None]:
    """The ranks (FSDP) joined while inside; nothing to join in one process."""
    return _ranks(cfg, resume) if cfg.trainer.distributed else contextlib.nullcontext()


def _open(cfg: RunConfig, resume: bool) -> Session:
    _use_rank_device(cfg)  # CUDA's current device is the thread's own: this one may load
    with LOADING:
        return open_session(cfg.trainer, cfg.model, cfg.checkpoint_url(), cfg.max_steps, resume)


@contextlib.contextmanager
def _closing(rank: TrainerRank) -> Iterator[TrainerRank]:
    """On leaving, rank 0 tells the followers to stop."""
    try:
        yield rank
    finally:
        rank.close()


@contextlib.contextmanager
def trainer_rank(cfg: RunConfig, resume: bool) -> Iterator[TrainerRank]:
    """Join the ranks (FSDP) and open the session; on leaving, rank 0 tells the followers to
    stop."""
    with _joined(cfg, resume), _closing(TrainerRank(cfg, _open(cfg, resume))) as rank:
        yield rank


class StoppedWhileLoading(Exception):
    """A stop came before the session was open: the ranks are left as after a failure (a
    follower may wait in a collective rank 0 will never join)."""


class TrainerRole:
    """Trains every batch of the run until max_steps or `stop`, one optimizer step each,
    publishing a WeightVersion and a TrainStep per step. `resume`: from the run's newest
    checkpoint (NothingToResume without one; without `resume` an existing one is refused,
    CheckpointExists)."""

    name = "trainer"
    reads = ("batches",)
    writes = ("weights", "steps")

    def __init__(self, cfg: RunConfig, resume: bool = False):
        self.cfg = cfg
        self.resume = resume

    def groups(self) -> list[str]:
        return [group_of(GROUP, self.cfg.run_id)]

    def describe(self) -> str:
        cfg = self.cfg
        return f"trainer: {cfg.model}, checkpoints {cfg.checkpoint_url()}"

    async def run(self, stop: asyncio.Event) -> RoleSummary:
        cfg, resume = self.cfg, self.resume
        try:
            with _joined(cfg, resume):
                # Loading takes minutes for a large model: off the event loop, so that a stop
                # (Ctrl-C, SIGTERM) ends the role at once instead of after the load. (The ranks
                # are joined here: rank 0's followers die with the thread that started them.)
                session = await unless_stopped(lambda: _open(cfg, resume), stop, "loading")
                if session is None:
                    raise StoppedWhileLoading
                with _closing(TrainerRank(cfg, session)) as rank:
                    log.info("trainer at step %d", session.state.step)
                    if not rank.leads:
                        rank.follow()
                        return RoleSummary(self.name, f"rank {session.trainer.ranks.rank} stopped")
                    step = await rank.run(stop)
        except StoppedWhileLoading:
            return RoleSummary(self.name, "trainer stopped while loading", finished=False)
        return RoleSummary(self.name, f"trainer stopped at step {step}", figures={"step": step})
