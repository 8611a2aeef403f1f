"""`rlbus replay sft`: samples built from ClickHouse carry exactly the stored token ids, with
loss on exactly the sampled ones; the command trains from them and writes a loadable model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import typer
from support import ScriptedServer
from typer.testing import CliRunner

from rlbus.bus.store import open_store
from rlbus.commands.replay import register
from rlbus.config import Settings
from rlbus.config.env import cli_overrides
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.orchestrator.stored_samples import ReplayError, stored_samples
from rlbus.environment import load_environment
from rlbus.launch.eval import run_eval
from rlbus.launch.export import export
from rlbus.schemas import RolloutScored, TokenRecord, TraceNode, derived_id, masks
from rlbus.schemas.packed import mask, pack_logprobs, pack_tokens, tokens
from rlbus.ui.report import write_report

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


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
        stored = asyncio.run(stored_samples(store, "reward >= 1 AND env = 'reverse_text'", "r1"))
    samples = stored.samples
    assert stored.rollouts == 2 and stored.without_tokens == 0
    assert {s.rollout_id for s in samples} == set(expected) == {"rollout-0", "rollout-2"}
    for s in samples:
        ids, sampled = expected[s.rollout_id]
        assert tokens(s.input_ids).tolist() == ids
        assert mask(s.loss_mask).tolist() == [masks.SUPERVISED * x for x in sampled]
        assert s.policy_version == 2


def cli() -> typer.Typer:
    app, worker = typer.Typer(), typer.Typer()
    app.add_typer(worker, name="worker")
    register(app, worker)
    return app


def bus_options(settings: Settings) -> list[str]:
    return [
        "--store.url",
        settings.store.url,
        "--kafka.bootstrap-servers",
        settings.kafka.bootstrap_servers,
        "--kafka.topic-prefix",
        settings.kafka.topic_prefix,
        "--claim-check.url",
        settings.claim_check.url,
    ]


def test_replay_sft_trains_a_model_and_leaves_its_history_in_the_store(
    settings: Settings, tmp_path: Path
) -> None:
    fill_store(settings.store.url)
    model, out = tmp_path / "tiny", tmp_path / "sft"
    init_model(model, seed=0)
    result = CliRunner().invoke(
        cli(),
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
            "--run-id",
            "sft-1",
            "--steps",
            "3",
            "--batch-size",
            "2",
            *bus_options(settings),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (
        "2 samples" in result.output
        and (out / "model.safetensors").exists()
        and (out / "tokenizer.json").exists()
    )
    with open_store(settings.store.url, read_only=True) as store:
        steps = store.query(
            "SELECT step, num_samples, loss > 0 FROM train_steps FINAL WHERE run_id = 'sft-1' "
            "ORDER BY step"
        ).rows
        batches = store.query(
            "SELECT step, algorithm, JSONLength(samples), num_tokens FROM batches FINAL "
            "WHERE run_id = 'sft-1' ORDER BY step"
        ).rows
        versions = store.query(
            "SELECT version, uri FROM weight_versions FINAL WHERE run_id = 'sft-1' ORDER BY version"
        ).rows
        curve = store.query(
            "SELECT step, mean_versions_behind FROM staleness WHERE run_id = 'sft-1' ORDER BY step"
        ).rows
    assert steps == [(1, 2, 1), (2, 2, 1), (3, 2, 1)]
    assert [b[:3] for b in batches] == [(1, "sft", 2), (2, "sft", 2), (3, "sft", 2)]
    assert all(b[3] == 2 * 19 for b in batches)  # two 19-token samples per batch
    assert versions == [(0, str(model)), (3, str(out))]
    assert [c[0] for c in curve] == [1, 2, 3]
    report = write_report(settings.store.url, "sft-1", tmp_path / "report")
    assert {"loss", "throughput"} <= set(report.pngs) and "reward" not in report.pngs


def test_replay_sft_refuses_an_empty_selection(settings: Settings, tmp_path: Path) -> None:
    fill_store(settings.store.url)
    model = tmp_path / "tiny"
    init_model(model, seed=0)
    nothing = CliRunner().invoke(
        cli(),
        [
            "replay",
            "sft",
            "--model",
            str(model),
            "--out",
            str(tmp_path / "sft"),
            "--where",
            "reward > 5",
            *bus_options(settings),
        ],
    )
    assert nothing.exit_code == 2 and "no scored rollout matches" in nothing.output


def fill_eval_mode(url: str) -> None:
    """Rollouts as eval mode stores them against an outside endpoint: messages, trace nodes and
    token rows without ids."""
    with open_store(url) as store:
        for i in range(2):
            rollout = f"eval-{i}"
            node = TraceNode(
                run_id="e1",
                node_id=derived_id(rollout, "node", 0),
                rollout_id=rollout,
                role="assistant",
                message={"role": "assistant", "content": "olleh"},
                sampled=True,
                call_index=0,
            )
            record = TokenRecord(run_id="e1", rollout_id=rollout, node_id=node.node_id)
            scored = RolloutScored(
                run_id="e1", rollout_id=rollout, group_id="g", task_id=f"t{i}", env="e", reward=1
            )
            for offset, events in enumerate(([node], [record], [scored])):
                store.insert_events(events, [(0, 10 * i + offset)], f"{rollout}-{offset}")


def test_eval_mode_rollouts_are_named_as_tokenless_with_the_way_to_get_tokens(
    settings: Settings, tmp_path: Path
) -> None:
    fill_eval_mode(settings.store.url)
    with open_store(settings.store.url, read_only=True) as store:
        with pytest.raises(ReplayError) as caught:
            asyncio.run(stored_samples(store, "reward >= 1"))
    message = str(caught.value)
    assert "2 rollouts match but none holds token ids" in message
    assert "--mode train" in message and "rlbus worker inference" in message
    model = tmp_path / "tiny"
    init_model(model, seed=0)
    result = CliRunner().invoke(
        cli(),
        [
            "replay",
            "sft",
            "--model",
            str(model),
            "--out",
            str(tmp_path / "o"),
            *bus_options(settings),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "none holds token ids" in result.output and "reshape" not in result.output


def test_a_real_eval_run_against_an_outside_endpoint_replays_as_tokenless_and_exports_as_chat(
    settings: Settings, tmp_path: Path
) -> None:
    """What a user meets: `rlbus eval` against an OpenAI-compatible server that returns no token
    ids, then `rlbus replay sft` on its rollouts."""
    with ScriptedServer() as upstream:  # answers reverse-text tasks correctly
        env = load_environment(
            str(EXAMPLES / "reverse_text"),
            cli_overrides("scripted", f"{upstream.url}/v1", None, None, None, None),
        )
        result = run_eval(env, settings, n=3, run_id="ev", show_progress=False)
    assert result.tally.rollouts == 3 * env.config.group_size
    with open_store(settings.store.url, read_only=True) as store:
        with pytest.raises(ReplayError, match="none holds token ids"):
            asyncio.run(stored_samples(store, "reward >= 1", "ev"))
        out = tmp_path / "chat.jsonl"
        done = export(store, out, "jsonl", "reward >= 1", "ev")
    assert done.rows == done.rollouts == result.tally.rollouts
    first = json.loads(out.read_text().splitlines()[0])
    assert [m["role"] for m in first["messages"]][-1] == "assistant"


def test_sft_trains_with_the_configured_threads(tmp_path: Path) -> None:
    """`--trainer.threads` holds for SFT as for the RL trainer (SFT ignored it: on a busy
    2-core machine torch's two spinning threads made a tiny model's step ten times slower than
    one thread, 3.3 s against 0.33 s)."""
    import torch

    from rlbus.config.trainer import TrainerConfig
    from rlbus.consumers.trainer.sft import train_sft
    from rlbus.schemas import TrainSample
    from rlbus.schemas.packed import pack_mask

    model = tmp_path / "tiny"
    init_model(model, seed=0)
    sampled = np.array([0] * 4 + [masks.SUPERVISED] * 4, dtype=np.uint8)
    sample = TrainSample(
        rollout_id="r",
        input_ids=pack_tokens(list(range(97, 105))),
        loss_mask=pack_mask(sampled),
        advantages=pack_logprobs(sampled.astype(np.float32)),
        inference_logprobs=pack_logprobs(np.zeros(8)),
    )
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        train_sft([sample], model, tmp_path / "out", TrainerConfig(threads=1), 1, 1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
