"""`rlbus export`: stored rollouts as chat-format rows (messages with tool calls, the tools offered,
reward, env, task, run) or as exact token ids and loss masks, in JSONL or Parquet that
`datasets.load_dataset` reads; the same reader as `rlbus replay sft`, and user SQL only on the
read-only path."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import typer
from typer.testing import CliRunner

from rlbus.bus.store import StoreError, open_store
from rlbus.bus.store.rollout_reader import read_rollouts
from rlbus.commands.export import register
from rlbus.schemas import RolloutCompleted, RolloutScored, TokenRecord, TraceNode, derived_id
from rlbus.schemas.packed import pack_logprobs, pack_tokens

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
}
PROMPT = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": [{"type": "text", "text": "add 1 and 2"}]},
]
COMPLETION = [
    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    {"role": "assistant", "content": "3"},
]


def events_of(rollout: str, task: str, reward: float, run: str = "r1") -> list[list]:
    """A tool-using rollout: its event, its trace (user prompt ids, sampled ids), its token record
    and a score."""
    node_ids = [derived_id(rollout, "node", i) for i in range(2)]
    nodes = [
        TraceNode(
            run_id=run,
            node_id=node_ids[0],
            rollout_id=rollout,
            role="user",
            message=PROMPT[1],
            token_ids=pack_tokens([1, 2, 3]),
        ),
        TraceNode(
            run_id=run,
            node_id=node_ids[1],
            rollout_id=rollout,
            parent_id=node_ids[0],
            index=1,
            role="assistant",
            message=COMPLETION[0],
            token_ids=pack_tokens([7, 8]),
            sampled=True,
            call_index=0,
        ),
    ]
    record = TokenRecord(
        run_id=run,
        rollout_id=rollout,
        node_id=node_ids[1],
        prompt_ids=pack_tokens([1, 2, 3]),
        completion_ids=pack_tokens([7, 8]),
        logprobs=pack_logprobs([-0.5, -0.25]),
        policy_version=4,
    )
    completed = RolloutCompleted(
        run_id=run,
        rollout_id=rollout,
        group_id=f"g-{task}",
        task_id=task,
        env="calc",
        prompt=PROMPT,
        completion=COMPLETION,
        model="m",
        tools=[ADD],
    )
    scored = RolloutScored(
        run_id=run,
        rollout_id=rollout,
        group_id=f"g-{task}",
        task_id=task,
        env="calc",
        reward=reward,
        rewards={"exact": reward},
        policy_version=4,
        scorer_version="rules-a",
    )
    return [[completed], nodes, [record], [scored]]


def fill(url: str) -> None:
    """Three tool-using rollouts, one plain eval-mode one (a string prompt, no token ids), and a
    later scorer version that fails the first rollout."""
    batches = [
        *events_of("ro-0", "t0", 1.0),
        *events_of("ro-1", "t1", 0.0),
        *events_of("ro-2", "t2", 1.0),
        [
            RolloutCompleted(
                run_id="r1",
                rollout_id="ro-3",
                group_id="g-t3",
                task_id="t3",
                env="calc",
                prompt="say hi",
                completion=[{"role": "assistant", "content": "hi"}],
            )
        ],
        [TokenRecord(run_id="r1", rollout_id="ro-3")],
        [
            RolloutScored(
                run_id="r1",
                rollout_id="ro-3",
                group_id="g-t3",
                task_id="t3",
                env="calc",
                reward=1.0,
            )
        ],
        [
            RolloutScored(
                run_id="r1",
                rollout_id="ro-0",
                group_id="g-t0",
                task_id="t0",
                env="calc",
                reward=0.0,
                scorer_version="rules-b",
                ts=4e9,
            )
        ],
    ]
    with open_store(url) as store:
        for i, events in enumerate(batches):
            store.insert_events(events, [(0, 100 * i + j) for j in range(len(events))], f"b{i}")


def cli() -> typer.Typer:
    app, worker = typer.Typer(), typer.Typer()
    app.add_typer(worker, name="worker")
    register(app, worker)
    return app


def export(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli(), ["export", "--store.url", url, *args])
    return result.exit_code, " ".join(result.output.split())  # as read, however rich wrapped it


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"chdb://{tmp_path / 'store'}"
    fill(url)
    return url


def test_chat_rows_are_what_sft_trainers_read(url: str, tmp_path: Path) -> None:
    out = tmp_path / "chat.jsonl"
    code, output = export(url, "--where", "reward >= 1", "--format", "jsonl", "--out", str(out))
    assert code == 0, output
    assert "2 rows from 2 rollouts" in output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # ro-0 failed under the newest scorer version, so the newest scores select ro-2 and ro-3
    assert [r["rollout_id"] for r in rows] == ["ro-2", "ro-3"]
    tools, plain = rows
    assert [m["role"] for m in tools["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    call = tools["messages"][2]
    assert call["content"] is None and call["tool_calls"] == [TOOL_CALL]
    assert tools["messages"][1]["content"] == "add 1 and 2"  # text parts joined
    assert tools["messages"][3]["tool_call_id"] == "call_1"
    assert json.loads(tools["tools"]) == [ADD]
    assert tools["reward"] == 1.0 and json.loads(tools["rewards"]) == {"exact": 1.0}
    assert (tools["env"], tools["task_id"], tools["run_id"], tools["scorer_version"]) == (
        "calc",
        "t2",
        "r1",
        "rules-a",
    )
    assert plain["messages"] == [
        {
            "role": "user",
            "content": "say hi",
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
        },
        {
            "role": "assistant",
            "content": "hi",
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
        },
    ]
    assert json.loads(plain["tools"]) == []
    loaded = datasets.load_dataset("json", data_files=str(out), split="train")
    assert loaded["rollout_id"] == ["ro-2", "ro-3"]
    assert loaded[0]["messages"][2]["tool_calls"][0]["function"]["name"] == "add"


def test_a_scorer_version_selects_by_its_own_scores_into_parquet(url: str, tmp_path: Path) -> None:
    out = tmp_path / "chat.parquet"
    code, output = export(
        url,
        "--where",
        "reward >= 1",
        "--scorer-version",
        "rules-a",
        "--run",
        "r1",
        "--format",
        "parquet",
        "--out",
        str(out),
    )
    assert code == 0, output
    loaded = datasets.load_dataset("parquet", data_files=str(out), split="train")
    assert loaded["rollout_id"] == ["ro-0", "ro-2"] and loaded["scorer_version"] == ["rules-a"] * 2
    messages = loaded[0]["messages"]
    assert messages[2]["tool_calls"][0]["function"] == TOOL_CALL["function"]
    assert messages[4] == {
        "role": "assistant",
        "content": "3",
        "tool_calls": None,
        "tool_call_id": None,
        "name": None,
    }


def test_token_rows_hold_the_exact_ids_and_masks_and_name_tokenless_rollouts(
    url: str, tmp_path: Path
) -> None:
    out = tmp_path / "tokens.parquet"
    code, output = export(
        url, "--where", "env = 'calc'", "--tokens", "--format", "parquet", "--out", str(out)
    )
    assert code == 0, output
    assert "3 rows" in output and "1 rollouts without token ids left out" in output
    loaded = datasets.load_dataset("parquet", data_files=str(out), split="train")
    assert loaded["rollout_id"] == ["ro-0", "ro-1", "ro-2"]
    row = loaded[0]
    assert row["input_ids"] == [1, 2, 3, 7, 8]
    assert row["loss_mask"] == [0, 0, 0, 1, 1]
    assert row["logprobs"] == [0.0, 0.0, 0.0, -0.5, -0.25]
    assert row["policy_version"] == 4 and row["reward"] == 0.0  # ro-0's newest score
    tokenless = tmp_path / "none.jsonl"
    code, output = export(url, "--where", "task_id = 't3'", "--tokens", "--out", str(tokenless))
    assert code == 2 and "none holds token ids" in output and "--mode train" in output
    assert not tokenless.exists()


def test_nothing_selected_and_writes_are_refused(url: str, tmp_path: Path) -> None:
    code, output = export(url, "--where", "reward > 5", "--out", str(tmp_path / "x.jsonl"))
    assert code == 2 and "no scored rollout matches" in output
    assert not (tmp_path / "x.jsonl").exists()
    code, output = export(url, "--format", "csv")
    assert code == 2 and "choose jsonl or parquet" in output
    code, output = export(
        url,
        "--where",
        "1) UNION ALL SELECT 1 FROM file('/etc/passwd') WHERE (1",
        "--out",
        str(tmp_path / "y.jsonl"),
    )
    assert code == 2 and "refused" in output, output
    with open_store(url) as store, pytest.raises(StoreError, match="read-only store"):
        next(read_rollouts(store, "reward >= 1"))
