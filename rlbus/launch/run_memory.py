"""Whether a local run's trainer and inference replicas fit in this machine's memory together,
checked by `rlbus run` before it starts any role, from the model directory's sizes alone (the
same estimates each role checks before it loads: consumers/trainer/memory.py,
consumers/inference/sizing.py).

Roles on a GPU are left to check themselves when they start (reading a GPU's free memory here
would hold CUDA memory in the launcher for the whole run); a refusal of theirs ends the run as
soon as they exit.
"""

from __future__ import annotations

import logging

from rlbus.config.runs import RunConfig
from rlbus.consumers.inference.sizing import serving_estimate
from rlbus.consumers.model_size import NotEnoughMemory, available_bytes, gb, model_size
from rlbus.consumers.trainer.memory import estimate_from_size, least_tokens
from rlbus.launch.teachers import servers_needed

log = logging.getLogger(__name__)


def check_run_fits(cfg: RunConfig, available: int | None = None) -> None:
    """Refuse (NotEnoughMemory) a run whose trainer and inference replicas on this machine's
    CPU would need more than its available memory (`available`: MemAvailable unless given)."""
    size = model_size(cfg.model)
    if size is None:
        return
    free = available if available is not None else available_bytes("cpu")
    if free is None:
        return
    parts: list[str] = []
    need = 0
    alone: list[str] = []
    """What to change for a role that does not fit even by itself."""
    together = ["lower trainer.micro_batch_tokens"]
    """What to change when each fits but not both."""
    trainer = cfg.trainer
    if trainer.device == "cpu":
        est = estimate_from_size(size, trainer)
        tokens = least_tokens(trainer)
        need += est.total(tokens)
        parts.append(f"the trainer {est.describe(tokens)}")
        if est.total(tokens) > free:
            alone.append(f"for the trainer, {est.hint(free)}")
        if not trainer.lora.enabled:
            together.append("set trainer.lora.enabled = true")
    inference = cfg.inference
    replicas = 0 if inference.given() else inference.replicas
    # A stored-version teacher is served here, by the run, even when the policy is not; LoRA
    # teachers of one base share a server.
    teachers = servers_needed(cfg)
    serving = None
    if (replicas or teachers) and inference.device == "cpu":
        serving = serving_estimate(size, inference.backend, "cpu", inference.vllm, free)
    if serving is not None:
        for count, what in ((replicas, "inference replica"), (teachers, "teacher server")):
            if count:
                need += count * serving.total
                each = " each" if count > 1 else ""
                parts.append(f"{count} {what}{'s' if count > 1 else ''} {serving.describe()}{each}")
        if serving.total > free:
            alone.append(f"for inference, {serving.hint}")
        if replicas > 1:
            together.append("start fewer inference.replicas")
        if replicas:
            together.append("serve from another machine (inference.url)")
        if teachers:
            together.append("serve the teachers yourself (algorithm.teacher_url)")
    if need <= free:
        log.info("this run's memory estimate: %s; %s available", " + ".join(parts), gb(free))
        return
    hint = "; ".join(alone) if alone else f"together they do not fit: {', or '.join(together)}"
    raise NotEnoughMemory(
        f"this run would need ~{gb(need)} of this machine's memory: {' + '.join(parts)}; "
        f"{gb(free)} is available: {hint}"
    )
