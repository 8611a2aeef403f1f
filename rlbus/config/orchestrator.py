"""Orchestrator settings: the `[orchestrator]` table and the `[envs.NAME]` tables of a run
config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rlbus.config.base import Section
from rlbus.config.version_ref import VersionRef


class AlgorithmConfig(Section):
    name: str = "grpo"
    """grpo (default), sft, opd, self-distill, echo, or any name registered with @algorithm."""
    normalize_std: bool = False
    """grpo/echo: divide group-relative advantages by the group's reward std (GRPO's original
    form)."""
    length_penalty: float = Field(default=0.0, ge=0)
    """grpo/echo: reward minus length_penalty * completion tokens / the group's longest, before
    centering: among equally good answers the shorter ones win."""
    echo_weight: float = Field(default=1.0, ge=0)
    """echo: weight of the cross-entropy on environment tokens (tool results, user turns)."""
    teacher_url: str = ""
    """opd: /v1 URL of the teacher's inference server (POST /v1/score); self-distill: empty means
    the policy's."""
    teacher_model: str = ""
    """opd: the `model` each score request to teacher_url names, when that server serves several
    (an adapter's name: `rlbus worker inference --adapter NAME=URI`, vLLM's --lora-modules).
    `rlbus run` sets it for LoRA teachers of one base, which it serves on one engine. Empty: the
    server's own model."""
    teacher: str = ""
    """opd: the teacher as a weight version of a past run, run:RUN_ID@VERSION (or @latest), found
    in this run's store: `rlbus run` writes it out (onto teacher_base) and serves it itself, and
    refuses to start when it cannot. Instead of teacher_url, not with it."""
    teacher_base: str = ""
    """The model directory the teacher's run started from (its `model`; the store does not record
    it), resolved as `model` is. Empty: this run's model."""

    @field_validator("teacher")
    @classmethod
    def _teacher_names_a_version(cls, teacher: str) -> str:
        if teacher:
            VersionRef.parse(teacher)  # VersionRefError (a ValueError) says how to write one
        return teacher

    @model_validator(mode="after")
    def _one_teacher(self) -> AlgorithmConfig:
        if self.teacher and self.teacher_url:
            raise ValueError(
                f"teacher = {self.teacher!r} and teacher_url = {self.teacher_url!r}: give one "
                "(teacher: a stored version rlbus serves; teacher_url: a server of your own)"
            )
        return self

    hint: str = "Hint: the answer is {answer}\n"
    """self-distill: text put before the teacher's context ({answer} is the task's answer)."""


class EnvEntry(Section):
    path: str
    """The environment: env.toml, a directory holding one, module:Class, FILE.py[:Class], or a
    hosted one (verifiers:NAME, openenv:PACKAGE, textarena:GAME, harbor:PATH)."""
    algorithm: AlgorithmConfig = AlgorithmConfig()
    weight: float = Field(default=1.0, gt=0)
    """Share of training tasks drawn from this environment."""
    producers: int = Field(default=1, ge=1)
    """Env producer processes `rlbus run` starts for it."""
    judges: int = Field(default=1, ge=1)
    """Judge processes `rlbus run` starts for it."""
    overrides: dict[str, Any] = {}
    """EnvConfig fields over the environment's TOML (group_size, sampling,
    max_concurrent_rollouts...)."""


class OrchestratorConfig(Section):
    standbys: int = Field(default=0, ge=0)
    """Orchestrators `rlbus run` starts besides the one that leads: each waits as a standby and
    one takes over (from what the bus holds) when the leader dies. Any `rlbus worker
    orchestrator` started for the run does the same."""
    mode: Literal["async", "sync"] = "async"
    """async: rollouts of the next steps run while the trainer trains; sync: each step waits for
    its rollouts, then for inference to serve the new weights."""
    tasks_per_step: int = Field(default=16, ge=1)
    """Groups (tasks) per training batch."""
    max_inflight_tasks: int = Field(default=0, ge=0)
    """Training tasks published but not yet turned into samples (backpressure); 0: as many as are
    expected to yield two steps' groups (2 x tasks_per_step while every group is kept; more when
    groups are dropped for zero signal or length, up to 8x that)."""
    max_off_policy_steps: int = Field(default=2, ge=0)
    """Samples whose oldest token is more versions behind the policy being trained are dropped and
    counted."""
    seq_len: int = Field(default=4096, ge=2)
    """Longest sample trained on; longer ones are dropped and counted."""
    drop_zero_signal: bool = True
    """Drop groups whose every token has advantage 0 (e.g. all rewards equal under grpo)."""
    eval_every: int = Field(default=0, ge=0)
    """Publish the held-out tasks whenever inference serves a version divisible by this (and at the
    first and last version); 0: never."""
    eval_tasks: int = Field(default=64, ge=1)
    """Held-out tasks per evaluation (the first ones of each environment's held-out split)."""
    eval_group_size: int = Field(default=1, ge=1)
    """Rollouts per held-out task."""
    held_out_fraction: float = Field(default=0.05, gt=0, lt=1)
    """Share of each task set kept out of training (chosen by a hash of the task id)."""
    seed: int = 0
    """Seed of the training task order (a shuffle buffer over each task set)."""
    incomplete_after_s: float = Field(default=1800, gt=0)
    """A rollout whose pieces (trace, tokens, rollout, score) are not all in this long after the
    first is dropped and counted, so it never holds back the commits of what came after it."""
