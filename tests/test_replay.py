"""`rlbus replay sft`: samples built from ClickHouse carry exactly the stored token ids, with
loss on exactly the sampled ones; the command trains from them and writes a loadable model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import typer
from typer.testing import CliRunner

from rlbus.bus.store import open_store
from rlbus.commands.run import register
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.orchestrator.replay import stored_samples
from rlbus.schemas import RolloutScored, TokenRecord, TraceNode, derived_id, masks
from rlbus.schemas.packed import mask, pack_logprobs, pack_tokens, tokens


def two_turn_trace(
    rollout: str, seed: int
) -> tuple[list[TraceNode], list[TokenRecord], list[int], list[int]]:
    """user -> assistant (sampled) -> tool result -> assistant (sampled): ids and which were
    sampled."""
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 255, n).tolist() for n in (7, 4, 5, 3)]
    ids = [i for p in parts for i in p]
    sampled = [0] * 7 + [1] * 4 + [0] * 5 + [1] * 3
    node_ids = [derived_id(rollout, "node", i) for i in range(4)]
    nodes = [
        TraceNode(
            run_id="r1",
            node_id=node_ids[i],
            rollout_id=rollout,
            parent_id=node_ids[i - 1] if i else "",
            index=i,
            role=("user", "assistant", "tool", "assistant")[i],
            token_ids=pack_tokens(parts[i]),
            sampled=i in (1, 3),
            call_index={1: 0, 3: 1}.get(i, -1),
        )
        for i in range(4)
    ]
    records = [
        TokenRecord(
            run_id="r1",
            rollout_id=rollout,
            call_index=0,
            node_id=node_ids[1],
            prompt_ids=pack_tokens(parts[0]),
            completion_ids=pack_tokens(parts[1]),
            logprobs=pack_logprobs([-0.1] * 4),
            policy_version=2,
        ),
        TokenRecord(
            run_id="r1",
            rollout_id=rollout,
            call_index=1,
            node_id=node_ids[3],
            prompt_ids=pack_tokens(ids[:16]),
            completion_ids=pack_tokens(parts[3]),
            logprobs=pack_logprobs([-0.2] * 3),
            policy_version=3,
        ),
    ]
    return nodes, records, ids, sampled


def fill_store(url: str) -> dict[str, tuple[list[int], list[int]]]:
    expected = {}
    with open_store(url) as store:
        for i, reward in enumerate((1.5, 0.25, 1.0)):
            rollout = f"rollout-{i}"
            nodes, records, ids, sampled = two_turn_trace(rollout, i)
            scored = RolloutScored(
                run_id="r1",
                rollout_id=rollout,
                group_id="g",
                task_id=f"t{i}",
                env="reverse_text",
                reward=reward,
            )
            for offset, events in enumerate((nodes, records, [scored])):
                store.insert_events(
                    events,
                    [(0, 10 * i + offset + j) for j in range(len(events))],
                    f"{rollout}-{offset}",
                )
            if reward >= 1:
                expected[rollout] = (ids, sampled)
    return expected


def test_samples_from_the_store_match_the_stored_ids_exactly(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path / 'store'}"
    expected = fill_store(url)
    with open_store(url, read_only=True) as store:
        samples = asyncio.run(stored_samples(store, "reward >= 1 AND env = 'reverse_text'", "r1"))
    assert {s.rollout_id for s in samples} == set(expected) == {"rollout-0", "rollout-2"}
    for s in samples:
        ids, sampled = expected[s.rollout_id]
        assert tokens(s.input_ids).tolist() == ids
        assert mask(s.loss_mask).tolist() == [masks.SUPERVISED * x for x in sampled]
        assert s.policy_version == 2


def test_replay_sft_command_writes_a_trained_model(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path / 'store'}"
    fill_store(url)
    model, out = tmp_path / "tiny", tmp_path / "sft"
    init_model(model, seed=0)
    app, worker = typer.Typer(), typer.Typer()
    app.add_typer(worker, name="worker")
    register(app, worker)
    result = CliRunner().invoke(
        app,
        [
            "replay",
            "sft",
            "--model",
            str(model),
            "--out",
            str(out),
            "--where",
            "reward >= 1",
            "--run",
            "r1",
            "--store.url",
            url,
            "--steps",
            "3",
            "--batch-size",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (
        "2 samples" in result.output
        and (out / "model.safetensors").exists()
        and (out / "tokenizer.json").exists()
    )
    nothing = CliRunner().invoke(
        app,
        [
            "replay",
            "sft",
            "--model",
            str(model),
            "--out",
            str(out),
            "--where",
            "reward > 5",
            "--store.url",
            url,
        ],
    )
    assert nothing.exit_code == 2 and "no scored rollout matches" in nothing.output
