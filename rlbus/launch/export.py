"""`rlbus export` as a library call: the rollouts bus.store.rollouts selects, written as a data
set file, JSONL or Parquet, with one Arrow schema for both so `datasets.load_dataset` reads either
the same way.

Chat rows are OpenAI chat format, what TRL's SFTTrainer, axolotl and prime-rl's SFT read:
`messages` (prompt then completion; each message role, content text, tool_calls with JSON
string arguments, tool_call_id, name) and `tools` (the tools offered, a JSON string: tool schemas
differ in shape from one tool to the next, which one column type cannot hold). Token rows are
one per trace branch: the exact ids, a loss mask (1 = sampled by the model) and the inference
log-probs. Both carry reward, rewards (JSON), env, task, run, rollout and scorer version.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from rlbus.bus.store import Store
from rlbus.bus.store.rollout_reader import NO_TOKENS_HELP, StoredRollout, describe, read_rollouts
from rlbus.schemas.packed import logprobs, mask, tokens
from rlbus.schemas.samples import trace_samples

Format = Literal["jsonl", "parquet"]
ROWS_PER_BLOCK = 1000

TOOL_CALL = pa.struct(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
    ]
)
MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("tool_calls", pa.list_(TOOL_CALL)),
        ("tool_call_id", pa.string()),
        ("name", pa.string()),
    ]
)
ABOUT = [
    ("reward", pa.float64()),
    ("rewards", pa.string()),
    ("env", pa.string()),
    ("task_id", pa.string()),
    ("run_id", pa.string()),
    ("rollout_id", pa.string()),
    ("group_id", pa.string()),
    ("sample_index", pa.int64()),
    ("scorer_version", pa.string()),
]
CHAT = pa.schema(
    [
        ("messages", pa.list_(MESSAGE)),
        ("tools", pa.string()),
        *ABOUT,
        ("model", pa.string()),
        ("policy_version", pa.int64()),
    ]
)
TOKENS = pa.schema(
    [
        ("input_ids", pa.list_(pa.uint32())),
        ("loss_mask", pa.list_(pa.uint8())),
        ("logprobs", pa.list_(pa.float32())),
        ("policy_version", pa.int64()),
        ("branch", pa.int64()),
        *ABOUT,
    ]
)


class ExportError(ValueError):
    """An export that found nothing to write; the message says what was found."""


@dataclass
class Exported:
    path: Path
    rows: int
    rollouts: int
    without_tokens: int = 0
    """Token rows only: selected rollouts left out because they hold no token ids."""
    without_messages: int = 0
    """Chat rows only: selected rollouts whose RolloutCompleted is not in the store."""


def _text(content: Any) -> str | None:
    """Message content as text: a list of parts becomes its text parts joined."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return json.dumps(content)


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments", "")
    return {
        "id": call.get("id"),
        "type": call.get("type", "function"),
        "function": {
            "name": function.get("name"),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def exported_message(m: dict[str, Any]) -> dict[str, Any]:
    """One stored message in the export's fixed shape."""
    calls = m.get("tool_calls")
    return {
        "role": m.get("role"),
        "content": _text(m.get("content")),
        "tool_calls": [_tool_call(c) for c in calls] if calls else None,
        "tool_call_id": m.get("tool_call_id"),
        "name": m.get("name"),
    }


def _about(s: StoredRollout) -> dict[str, Any]:
    score = s.score
    return {
        "reward": score.reward,
        "rewards": json.dumps(score.rewards),
        "env": score.env,
        "task_id": score.task_id,
        "run_id": score.run_id,
        "rollout_id": score.rollout_id,
        "group_id": score.group_id,
        "sample_index": score.sample_index,
        "scorer_version": score.scorer_version,
    }


def chat_row(s: StoredRollout) -> dict[str, Any]:
    r = s.rollout
    assert r is not None
    prompt = [{"role": "user", "content": r.prompt}] if isinstance(r.prompt, str) else r.prompt
    return {
        "messages": [exported_message(m) for m in [*prompt, *r.completion]],
        "tools": json.dumps(r.tools),
        **_about(s),
        "model": r.model,
        "policy_version": s.score.policy_version,
    }


def token_rows(s: StoredRollout) -> list[dict[str, Any]]:
    """One row per trace branch; the mask marks the tokens that branch's own calls sampled."""
    versions = {r.call_index: r.policy_version for r in s.records}
    rows = []
    for branch, sample in enumerate(trace_samples(s.nodes, s.records)):
        rows.append(
            {
                "input_ids": tokens(sample.input_ids).tolist(),
                "loss_mask": mask(sample.loss_mask).tolist(),
                "logprobs": logprobs(sample.inference_logprobs).tolist(),
                "policy_version": max(versions.values(), default=0),
                "branch": branch,
                **_about(s),
            }
        )
    return rows


class _Writer:
    def __init__(self, path: Path, fmt: Format, schema: pa.Schema):
        self.fmt, self.schema = fmt, schema
        path.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            self._parquet = pq.ParquetWriter(path, schema)
        else:
            self._file = path.open("wb")
        self._encoder = msgspec.json.Encoder()

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        if self.fmt == "parquet":
            self._parquet.write_table(pa.Table.from_pylist(rows, self.schema))
        else:
            self._file.write(b"".join(self._encoder.encode(r) + b"\n" for r in rows))

    def close(self) -> None:
        """Idempotent."""
        if self.fmt == "parquet":
            self._parquet.close()
        else:
            self._file.close()


def _blocks(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    block: list[dict[str, Any]] = []
    for row in rows:
        block.append(row)
        if len(block) >= ROWS_PER_BLOCK:
            yield block
            block = []
    if block:
        yield block


def export(
    store: Store,
    path: Path,
    fmt: Format,
    where: str,
    run_id: str | None = None,
    version: str = "",
    with_tokens: bool = False,
) -> Exported:
    """Write the selected rollouts to `path`, block by block; nothing is left at `path` when the
    export fails. `store` is open read-only (`where` is the user's SQL)."""
    done = Exported(path, 0, 0)

    def rows() -> Iterator[dict[str, Any]]:
        for s in read_rollouts(store, where, run_id, version, tokens=with_tokens):
            done.rollouts += 1
            if with_tokens and not s.has_tokens:
                done.without_tokens += 1
            elif not with_tokens and s.rollout is None:
                done.without_messages += 1
            else:
                yield from token_rows(s) if with_tokens else [chat_row(s)]

    writer = _Writer(path, fmt, TOKENS if with_tokens else CHAT)
    try:
        for block in _blocks(rows()):
            writer.write(block)
            done.rows += len(block)
        writer.close()
        if not done.rollouts:
            raise ExportError(f"no scored rollout matches {describe(where, run_id, version)}")
        if not done.rows:
            why = (
                f"none holds token ids: {NO_TOKENS_HELP}"
                if with_tokens
                else "none has its RolloutCompleted event in the store"
            )
            raise ExportError(f"{done.rollouts:,} rollouts match but {why}")
    except BaseException:
        writer.close()
        with suppress(FileNotFoundError):
            path.unlink()
        raise
    return done
