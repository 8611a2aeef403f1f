"""Building a trainer from config: model (sharded under FSDP, or torchtitan's own decoder
parallelized by torchtitan), optimizer, checkpoint store, and the resume rule (--resume needs a
checkpoint; a fresh start refuses to overwrite one).

State goes through torch.distributed.checkpoint's full state dicts in every mode (parameter
names as keys), so a checkpoint written by one process resumes under FSDP and back; torchtitan's
decoder names its parameters its own way, so its checkpoints resume under torchtitan only.
A state holds the parameters that train: under LoRA the adapters, not the frozen base, which a
resume loads from `model` again after checking it against the base's digest in the state.
Published weights carry Hugging Face names whichever trainer wrote them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from rlbus.config.trainer import TrainerConfig
from rlbus.consumers.trainer.batch_trainer import Hooks
from rlbus.consumers.trainer.checkpoint import CheckpointStore, NothingToResume, TrainerState
from rlbus.consumers.trainer.distributed import TorchRanks
from rlbus.consumers.trainer.memory import check_training_fits
from rlbus.consumers.trainer.policy import (
    frozen_digest,
    frozen_names,
    load_policy,
    published_kind,
    published_weights,
    tied_aliases,
    without,
)
from rlbus.consumers.trainer.step import Trainer

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
STATE = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
"""A trainer state's model part: frozen parameters left out before they are copied off the
device (loading a state without them keeps the model's own)."""
WEIGHTS_DTYPES: dict[str, torch.dtype | None] = {
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "same": None,
}


class CheckpointExists(RuntimeError):
    """A fresh start would overwrite a run's checkpoints."""


class WrongBaseModel(RuntimeError):
    """A state resumed onto frozen weights other than those it was trained with."""


def check_same_base(trained: dict[str, str] | None, loaded: dict[str, str], url: str) -> None:
    """`trained`: the state's record of its frozen weights, None in a state saved before the
    record was kept (such a state holds every weight)."""
    if trained is not None and trained["digest"] != loaded["digest"]:
        raise WrongBaseModel(
            f"the trainer state under {url} leaves out the frozen weights of "
            f"{trained['model']}, which it was trained on; {loaded['model']} (the run's model) "
            "with this trainer.lora freezes other weights: resume with the model and "
            "trainer.lora the state was trained with"
        )


@dataclass
class Session:
    trainer: Trainer
    checkpoints: CheckpointStore
    state: TrainerState
    hooks: Hooks
    checkpoint_every: int = 1
    """Steps between saved trainer states (TrainerConfig.checkpoint_every)."""
    incarnation: str = ""
    """"" when the session started the run; a resumed session's own id (BatchTrainer)."""


def open_session(
    cfg: TrainerConfig, model_path: str, checkpoint_url: str, total_steps: int, resume: bool
) -> Session:
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    kind = published_kind(cfg.lora)
    checkpoints = CheckpointStore(
        checkpoint_url,
        cfg.keep_checkpoints,
        cfg.keep_weights,
        WEIGHTS_DTYPES[cfg.weights_dtype],
        kind,
    )
    if not resume and checkpoints.exists():
        raise CheckpointExists(
            f"{checkpoints.url} holds a checkpoint at step {checkpoints.latest_step()}: "
            "pass --resume to continue it, or use another run id / trainer.checkpoint_url"
        )
    if resume and not checkpoints.exists():
        raise NothingToResume(f"nothing to resume: no checkpoint under {checkpoints.url}")
    sharded = cfg.parallel != "none"
    if sharded and cfg.lora.enabled:
        raise ValueError(
            f"trainer.lora with trainer.parallel = {cfg.parallel!r} is not supported: train "
            "adapters in one process"
        )
    check_training_fits(cfg, model_path)  # NotEnoughMemory, with its estimate
    ranks = TorchRanks() if sharded else None
    if cfg.parallel == "torchtitan":
        from rlbus.consumers.trainer.titan import load_titan_policy

        assert ranks is not None
        titan = load_titan_policy(model_path, ranks.world, cfg.device, cfg.gradient_checkpointing)
        model: nn.Module = titan
        published = titan.hf_weights
    else:
        model = load_policy(model_path, cfg.lora, cfg.device, cfg.gradient_checkpointing)
        aliases = tied_aliases(model)  # before sharding, which may hide the tie
        if sharded:
            from rlbus.consumers.trainer.fsdp import shard

            shard(model)

        def published() -> dict[str, torch.Tensor]:
            if sharded:
                # a full state dict holds plain tensors (no ShardedTensor or DTensor shards)
                state = cast("dict[str, torch.Tensor]", get_model_state_dict(model, options=FULL))
                return without(aliases, state)
            return published_weights(model, kind)

    trainer = Trainer(model, cfg, total_steps, ranks)
    # Once: the frozen weights do not change while training.
    frozen = {"model": model_path, "digest": frozen_digest(model)}
    # STATE leaves a frozen parameter out under its first name only: a tied head's second
    # name would still carry the whole embedding.
    left_out = frozen_names(model)
    state = TrainerState()
    if resume:
        state, saved = checkpoints.load()
        check_same_base(saved.get("frozen"), frozen, checkpoints.url)
        set_state_dict(
            model,
            trainer.optimizer,
            model_state_dict=saved["model"],
            optim_state_dict=saved["optimizer"],
            options=STATE,
        )
        trainer.scheduler.load_state_dict(saved["scheduler"])

    def everything() -> dict:
        model_state, optim_state = get_state_dict(model, trainer.optimizer, options=STATE)
        return {
            "model": without(left_out, model_state),
            "optimizer": optim_state,
            "scheduler": trainer.scheduler.state_dict(),
            "frozen": frozen,
        }

    return Session(
        trainer,
        checkpoints,
        state,
        Hooks(
            weights=published,
            state=everything,
            num_params=sum(p.numel() for p in model.parameters()),
        ),
        cfg.checkpoint_every,
        uuid.uuid4().hex if resume else "",
    )
