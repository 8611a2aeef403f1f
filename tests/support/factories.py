"""Realistic events of every kind, deterministic from an index (shared by store and sink tests)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlbus.schemas import (
    DeadLetter,
    Event,
    HealthSample,
    RolloutCompleted,
    RolloutScored,
    RunIncident,
    TaskPublished,
    TokenRecord,
    TraceNode,
    TrainBatch,
    TrainSample,
    TrainStep,
    WeightLoaded,
    WeightVersion,
    derived_id,
)
from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens


def make_event(kind: type[Event], i: int, run_id: str = "test-run") -> Event:
    rng = np.random.default_rng(i)
    ids = rng.integers(0, 32_000, int(rng.integers(1, 64)))
    lps = -rng.random(len(ids)).astype(np.float32)
    rollout, group = derived_id("rollout", i), derived_id("group", i // 8)
    common = {"run_id": run_id, "ts": 1.7e9 + i + 0.123456}
    match kind:
        case _ if kind is TaskPublished:
            return TaskPublished(
                task_id=derived_id("task", i),
                env="reverse_text",
                answer=f"a{i}",
                prompt=[{"role": "user", "content": f"reverse {i} ünïcode"}],
                info={"n": i, "tags": ["x", "y"]},
                group_size=8,
                **common,
            )
        case _ if kind is RolloutCompleted:
            return RolloutCompleted(
                rollout_id=rollout,
                group_id=group,
                task_id=derived_id("task", i // 8),
                env="reverse_text",
                sample_index=i % 8,
                group_size=8,
                prompt=f"prompt {i}",
                completion=[{"role": "assistant", "content": str(i)}],
                status="error" if i % 17 == 0 else "ok",
                error="boom" if i % 17 == 0 else "",
                num_turns=1,
                prompt_tokens=10,
                completion_tokens=len(ids),
                min_policy_version=i % 3,
                max_policy_version=i % 3 + 1,
                duration_s=0.5,
                **common,
            )
        case _ if kind is TraceNode:
            return TraceNode(
                node_id=derived_id("node", i),
                rollout_id=rollout,
                parent_id=derived_id("node", i - 1),
                index=i % 5,
                role="assistant",
                message={"role": "assistant", "content": "hi"},
                token_ids=pack_tokens(ids),
                sampled=bool(i % 2),
                call_index=i % 3,
                **common,
            )
        case _ if kind is TokenRecord:
            return TokenRecord(
                rollout_id=rollout,
                group_id=group,
                call_index=i % 3,
                model="tiny",
                prompt_ids=pack_tokens(ids[::-1]),
                completion_ids=pack_tokens(ids),
                logprobs=pack_logprobs(lps),
                policy_version=i % 4,
                finish_reason="stop",
                **common,
            )
        case _ if kind is RolloutScored:
            return RolloutScored(
                rollout_id=rollout,
                group_id=group,
                task_id=derived_id("task", i // 8),
                env="reverse_text",
                sample_index=i % 8,
                group_size=8,
                reward=float(i % 2),
                rewards={"exact": float(i % 2), "len": 0.25},
                metrics={"chars": float(i)},
                policy_version=i % 4,
                completion_tokens=len(ids),
                **common,
            )
        case _ if kind is TrainBatch:
            samples = [
                TrainSample(
                    rollout_id=derived_id("rollout", i, j),
                    input_ids=pack_tokens(ids),
                    loss_mask=pack_mask(ids % 2),
                    advantages=pack_logprobs(lps * 2),
                    inference_logprobs=pack_logprobs(lps),
                    policy_version=j,
                )
                for j in range(2)
            ]
            return TrainBatch(
                batch_id=derived_id("batch", i),
                step=i,
                samples=samples,
                num_tokens=2 * len(ids),
                **common,
            )
        case _ if kind is WeightVersion:
            return WeightVersion(
                version=i, step=i, uri=f"file:///ckpt/{i}.safetensors", num_params=900_000, **common
            )
        case _ if kind is WeightLoaded:
            return WeightLoaded(
                version=i, worker_id=f"w{i % 3}", load_s=0.1, uri=f"file:///ckpt/{i}", **common
            )
        case _ if kind is TrainStep:
            return TrainStep(
                step=i,
                loss=0.5,
                grad_norm=1.5,
                entropy=2.0,
                lr=3e-4,
                mismatch_kl=1e-3,
                num_samples=64,
                num_tokens=1000,
                tokens_per_s=5e4,
                staleness={"0": 60, "1": 4},
                metrics={"reward": 0.5},
                **common,
            )
        case _ if kind is DeadLetter:
            return DeadLetter(
                origin_topic="tasks",
                origin_partition=i % 4,
                origin_offset=i,
                consumer_group="env",
                error=f"decode: bad {i}",
                raw=bytes(rng.integers(0, 256, 16, dtype=np.uint8)),
                key=b"k",
                **common,
            )
        case _ if kind is HealthSample:
            return HealthSample(
                rss_mib={"sink": 300.0 + i, "trainer": 900.5, "broker": 64.25},
                lag={"sink": i % 7, f"judge.{run_id}.reverse_text": i % 3},
                **common,
            )
        case _ if kind is RunIncident:
            return RunIncident(
                incident="role-exited" if i % 2 else "broker-rotation",
                detail=f"incident {i}",
                process="env-2" if i % 2 else "",
                **common,
            )
    raise AssertionError(f"no factory for {kind.__name__}")


def scored_group(
    run_id: str,
    group_id: str,
    task_id: str,
    completions: list[list[int]],
    rewards: list[float],
    *,
    env: str = "reverse_text",
    info: dict[str, Any] | None = None,
    prompt: Sequence[int] = (1, 2, 3),
    version: int = 0,
) -> list[Event]:
    """A scored group with whole traces, as env producers and judges publish it: per member a
    prompt node, the sampled answer node, its token record, the completed and the scored
    rollout. One member per completion (token ids), each with its reward."""
    events: list[Event] = []
    size = len(completions)
    for i, (completion, reward) in enumerate(zip(completions, rewards, strict=True)):
        rollout_id = derived_id(group_id, i)
        common = {"run_id": run_id, "rollout_id": rollout_id}
        asked = TraceNode(node_id=f"{rollout_id}-0", token_ids=pack_tokens(prompt), **common)
        answer = TraceNode(
            node_id=f"{rollout_id}-1",
            parent_id=asked.node_id,
            index=1,
            token_ids=pack_tokens(completion),
            sampled=True,
            call_index=0,
            **common,
        )
        record = TokenRecord(
            group_id=group_id,
            node_id=answer.node_id,
            completion_ids=pack_tokens(completion),
            logprobs=pack_logprobs([-0.1] * len(completion)),
            policy_version=version,
            **common,
        )
        place = {
            "group_id": group_id,
            "task_id": task_id,
            "env": env,
            "sample_index": i,
            "group_size": size,
        }
        events += [
            asked,
            answer,
            record,
            RolloutCompleted(num_turns=1, info=dict(info or {}), **place, **common),
            RolloutScored(reward=reward, **place, **common),
        ]
    return events


def completed_rollout(i: int, group: str, size: int) -> RolloutCompleted:
    """Member `i` of a reverse_text group of `size`, answered right ("cba")."""
    return RolloutCompleted(
        rollout_id=f"{group}-{i}",
        group_id=group,
        task_id=group,
        env="reverse_text",
        sample_index=i,
        group_size=size,
        answer="cba",
        completion=[{"role": "assistant", "content": "cba"}],
    )
