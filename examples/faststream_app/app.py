"""Your own consumer on a live rlbus run, as a FastStream app: a custom reward (brevity) that
scores every finished rollout and publishes the score as rlbus's judge does, and an alert on
low rewards.

    rlbus eval examples/reverse_text --model M --base-url URL &    # or rlbus run / rlbus broker
    faststream run app:app --app-dir examples/faststream_app

It finds the embedded broker the way rlbus commands do (`./rlbus-data`); set
RLBUS_KAFKA__BOOTSTRAP_SERVERS (and any other RLBUS_* setting) to point it elsewhere.

Its scores go to `scored` under their own run id (`RUN+brevity`): the store keeps them next to
the judge's (the same rollout ids), while a training run's orchestrator, which serves one run,
keeps training on the judge's rewards.
"""

from __future__ import annotations

import os

from faststream import Logger

from rlbus.bus.faststream import FastStreamBus
from rlbus.config import load_settings
from rlbus.discovery import require_bootstrap
from rlbus.schemas import RolloutCompleted, RolloutScored, derived_id

TARGET_CHARS = float(os.environ.get("BREVITY_TARGET_CHARS", "200"))
"""Completion length (characters) that scores 0.5."""
ALERT_BELOW = float(os.environ.get("ALERT_BELOW", "0.2"))
"""Scores under this are logged as warnings."""

rl = FastStreamBus.of(require_bootstrap(load_settings()))
app = rl.app()


def brevity(rollout: RolloutCompleted) -> tuple[float, int]:
    said = "".join(
        str(m.get("content") or "") for m in rollout.completion if m.get("role") == "assistant"
    )
    return 1.0 / (1.0 + len(said) / TARGET_CHARS), len(said)


@rl.subscriber("rollouts", group="brevity")
async def score(rollout: RolloutCompleted) -> None:
    if rollout.status != "ok":
        return
    reward, chars = brevity(rollout)
    await rl.publish(
        RolloutScored(
            # Derived from the input: a redelivered rollout re-publishes the same score.
            event_id=derived_id("brevity", rollout.event_id),
            run_id=f"{rollout.run_id}+brevity",
            rollout_id=rollout.rollout_id,
            group_id=rollout.group_id,
            task_id=rollout.task_id,
            env=rollout.env,
            sample_index=rollout.sample_index,
            group_size=rollout.group_size,
            reward=reward,
            rewards={"brevity": reward},
            metrics={"completion_chars": float(chars)},
            policy_version=rollout.max_policy_version,
            completion_tokens=rollout.completion_tokens,
        )
    )


@rl.subscriber("scored", group="low-reward-alert")
async def alert(scored: RolloutScored, logger: Logger) -> None:
    if scored.status == "ok" and scored.reward < ALERT_BELOW:
        logger.warning(
            "low reward %.3f: rollout %s of %s (run %s, task %s)",
            scored.reward,
            scored.rollout_id,
            scored.env,
            scored.run_id,
            scored.task_id,
        )
