"""Environment definition without the bus: tagging decorators, discovery and argument
injection, config from TOML / entry points / module paths, task streams and loaders."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from rlbus.config import ConfigError
from rlbus.environment import (
    RuleError,
    Scorer,
    TaskSet,
    discover,
    group_reward,
    load_environment,
    metric,
    reward,
    tool,
)
from rlbus.environment.task_sources import load_tasks
from rlbus.environment.task_sources.stream import TaskStream
from rlbus.producers.harnesses import python_tool
from rlbus.schemas import RolloutCompleted, TaskPublished

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class Tagged(TaskSet):
    @reward(weight=2.0)
    def exact(self, text: str, answer: str) -> float:
        return float(text == answer)

    @reward
    async def length(self, completion: list) -> float:
        return float(len(completion))

    @metric
    def chars(self, text: str) -> float:
        return float(len(text))

    @group_reward(weight=0.5, name="first")
    def first_wins(self, texts: list[str]) -> list[float]:
        return [1.0] + [0.0] * (len(texts) - 1)

    @tool
    def add(self, a: int, b: int = 1, state: dict | None = None) -> int:
        """Add two integers.

        More prose that is not part of the description."""
        return a + b


def rollout(text: str, index: int = 0) -> RolloutCompleted:
    return RolloutCompleted(
        rollout_id=f"r{index}",
        group_id="g",
        task_id="t",
        env="tagged",
        sample_index=index,
        group_size=2,
        completion=[{"role": "assistant", "content": text}],
        answer="ok",
    )


def test_decorators_only_tag_and_discovery_finds_every_kind() -> None:
    assert Tagged.exact(Tagged(), "ok", "ok") == 1.0  # still a plain method
    rules = discover(Tagged())
    assert [r.name for r in rules.rewards] == ["exact", "length"]
    assert [r.name for r in rules.metrics] == ["chars"]
    assert [(r.name, r.weight) for r in rules.group_rewards] == [("first", 0.5)]
    assert rules.weights == {"exact": 2.0, "length": 1.0, "first": 0.5}
    assert rules.rewards[0].injected == ("text", "answer")


def test_unknown_parameter_is_refused_with_what_can_be_asked_for() -> None:
    class Bad(TaskSet):
        @reward
        def oops(self, txt: str) -> float:
            return 0.0

    with pytest.raises(RuleError, match=r"reward Bad.oops asks for 'txt'.*answer, completion"):
        discover(Bad())


def test_tool_schema_comes_from_the_signature_and_leaves_injected_args_out() -> None:
    schema, _ = python_tool(discover(Tagged()).tools[0])
    function = schema["function"]
    assert function["name"] == "add" and function["description"] == "Add two integers."
    assert function["parameters"]["required"] == ["a"]
    assert set(function["parameters"]["properties"]) == {"a", "b"}


def test_scorer_injects_by_name_and_weights_the_sum() -> None:
    env = load_environment(f"{__name__}:Tagged", {"group_size": 2})
    assert env.id == "tagged"
    scored = asyncio.run(Scorer(env).score([rollout("ok", 0), rollout("nope", 1)]))
    assert [s.rewards for s in scored] == [
        {"exact": 1.0, "length": 1.0, "first": 1.0},
        {"exact": 0.0, "length": 1.0, "first": 0.0},
    ]
    assert [s.reward for s in scored] == [2.0 + 1.0 + 0.5, 1.0]
    assert scored[1].metrics == {"chars": 4.0}


def test_toml_overrides_taskset_defaults_and_cli_overrides_toml(tmp_path: Path) -> None:
    (tmp_path / "env.py").write_text(
        textwrap.dedent("""
        from rlbus.environment import TaskSet
        class Words(TaskSet):
            defaults = {"group_size": 3, "harness": {"kind": "tools", "max_turns": 2}}
            def rows(self):
                return [{"prompt": w, "answer": w[::-1]} for w in self.args["words"]]
    """)
    )
    (tmp_path / "env.toml").write_text(
        textwrap.dedent("""
        [env]
        taskset = "env.py"
        args = { words = ["abc", "de", "fgh"] }
        [env.harness]
        max_turns = 5
        [env.sampling]
        temperature = 0.5
    """)
    )
    env = load_environment(str(tmp_path), {"sampling": {"max_tokens": 9}})
    assert env.id == "words"
    assert (env.config.group_size, env.config.harness.kind, env.config.harness.max_turns) == (
        3,
        "tools",
        5,
    )
    assert (env.config.sampling.temperature, env.config.sampling.max_tokens) == (0.5, 9)
    assert [t.answer for t in env.tasks("r1")] == ["cba", "ed", "hgf"]
    assert {t.env for t in env.tasks()} == {"words"}


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    (tmp_path / "env.toml").write_text(
        '[env]\ntaskset = "env.py"\ngroup_size = 0\n[env.harness]\nkind = "nope"\n'
    )
    (tmp_path / "env.py").write_text(
        "from rlbus.environment import TaskSet\nclass A(TaskSet): pass\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_environment(str(tmp_path / "env.toml"))
    assert "group_size" in str(caught.value) and "harness.kind" in str(caught.value)
    with pytest.raises(ConfigError, match="no environment 'not-installed'.*entry point"):
        load_environment("not-installed")


def test_entry_point_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "my_envs"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from rlbus.environment import TaskSet, reward\n"
        "class Echo(TaskSet):\n"
        "    name = 'echo'\n"
        "    def rows(self): return [{'prompt': 'x', 'answer': 'x'}]\n"
        "    @reward\n"
        "    def same(self, text, answer): return float(text == answer)\n"
    )
    dist = tmp_path / "my_envs-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-envs\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rlbus.environments]\necho = my_envs:Echo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = load_environment("echo")
    assert env.id == "echo" and [r.name for r in env.rules.rewards] == ["same"]


def test_task_stream_select_shuffle_skip_take_work_on_infinite_sets() -> None:
    def forever():
        i = 0
        while True:
            yield TaskPublished(task_id=str(i), env="n", prompt=str(i))
            i += 1

    stream = TaskStream(forever)
    evens = stream.select(lambda t: int(t.task_id) % 2 == 0).skip(2).take(3)
    assert [t.task_id for t in evens] == ["4", "6", "8"]
    assert [t.task_id for t in evens] == ["4", "6", "8"]  # re-iterable
    shuffled = [t.task_id for t in TaskStream(forever).take(50).shuffle(seed=1, buffer=10)]
    assert sorted(shuffled, key=int) == [str(i) for i in range(50)] and shuffled != sorted(
        shuffled, key=int
    )
    assert shuffled == [t.task_id for t in TaskStream(forever).take(50).shuffle(seed=1, buffer=10)]
    assert len(list(TaskStream(forever).shuffle(seed=0, buffer=8).take(20))) == 20


def test_reasoning_gym_loader_is_offline_and_deterministic() -> None:
    first = list(load_tasks("reasoning-gym:basic_arithmetic?size=5&seed=7", env="arith"))
    again = list(load_tasks("reasoning-gym:basic_arithmetic?size=5&seed=7", env="arith"))
    assert len(first) == 5 and [t.task_id for t in first] == [t.task_id for t in again]
    assert (
        first[0].prompt.startswith("Calculate")
        and first[0].info["metadata"]["source_dataset"] == "basic_arithmetic"
    )


@pytest.mark.parametrize(
    "example", ["reverse_text", "arithmetic", "calculator", "guess_number", "command_agent"]
)
def test_examples_load(example: str) -> None:
    env = load_environment(str(EXAMPLES / example))
    assert env.rules.rewards and next(iter(env.tasks())).prompt


def test_arithmetic_example_scores_with_the_generators_checker() -> None:
    env = load_environment(str(EXAMPLES / "arithmetic"))
    task = next(iter(env.tasks()))
    good = RolloutCompleted(
        rollout_id="a",
        group_id="g",
        task_id=task.task_id,
        env=env.id,
        prompt=task.prompt,
        answer=task.answer,
        info=task.info,
        completion=[{"role": "assistant", "content": f"so <answer>{task.answer}</answer>"}],
    )
    bad = RolloutCompleted(
        rollout_id="b",
        group_id="g",
        task_id=task.task_id,
        env=env.id,
        sample_index=1,
        prompt=task.prompt,
        answer=task.answer,
        info=task.info,
        completion=[{"role": "assistant", "content": "<answer>nope</answer>"}],
    )
    scored = asyncio.run(Scorer(env).score([good, bad]))
    assert [s.rewards["correct"] for s in scored] == [1.0, 0.0]
