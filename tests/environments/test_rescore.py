"""Scorer versions and `rlbus rescore`: a run evaluated once (scripted model, real broker, a sink
holding real chdb: test_eval's module store) is scored again with changed rules; both versions
stay queryable, the summary, the views and `rlbus rescore` itself read one version, a repeat
publishes nothing, group rewards see stored groups whole, and --where is refused unless it is
one condition."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest
import typer
from support import ScriptedServer
from test_eval import EXAMPLES, evaluate, rows, settings, upstream  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from rlbus.bus import Bus
from rlbus.bus.server_thread import ServerThread
from rlbus.bus.store import open_store
from rlbus.bus.waiting import wait_for
from rlbus.commands import rescore as rescore_command
from rlbus.config import Settings
from rlbus.environment import TaskSet, group_reward, load_environment, reward
from rlbus.environment.scoring import Scorer, rules_version
from rlbus.launch.eval import EvalResult
from rlbus.launch.eval_summary import read_eval_summary, scored_tasks
from rlbus.launch.rescore import RescoreError, rescore
from rlbus.schemas import RolloutCompleted, RolloutScored, derived_id
from rlbus.ui.app import create_app
from rlbus.ui.charts import format_number

REVERSE_TEXT = str(EXAMPLES / "reverse_text")


class Stricter(TaskSet):
    """reverse_text's tasks scored by exact match alone, and a group reward that says how many
    rollouts of the group it saw."""

    name = "reverse_text"

    @reward
    def exact(self, text: str, answer: str) -> float:
        return float(text.strip() == answer)

    @group_reward(weight=0.0)
    def group_seen(self, texts: list[str]) -> list[float]:
        return [float(len(texts))] * len(texts)


STRICTER = f"{__name__}:Stricter"


@pytest.fixture(scope="module")
def evaluated(settings: Settings, upstream: ScriptedServer) -> EvalResult:  # noqa: F811
    """3 tasks x 2 rollouts, all answered right: 1.75 each under reverse_text's own rules."""
    return evaluate(settings, REVERSE_TEXT, upstream, n=3, group_size=2)


def count(settings: Settings, sql: str, run: str) -> int:  # noqa: F811
    return rows(settings, sql, run)[0][0]


def test_the_default_version_is_a_digest_of_the_rules_and_names_are_checked() -> None:
    env = load_environment(REVERSE_TEXT)
    assert rules_version(env) == rules_version(load_environment(REVERSE_TEXT))
    assert rules_version(env).startswith("rules-") and len(rules_version(env)) == 14
    assert rules_version(load_environment(STRICTER)) != rules_version(env)
    heavier = load_environment(REVERSE_TEXT, {"args": {"n": 5}})
    assert rules_version(heavier) != rules_version(env)  # a task set's args may steer rewards
    assert Scorer(env, "v2.1").version == "v2.1"
    with pytest.raises(ValueError, match="scorer version 'two words'"):
        Scorer(env, "two words")


async def test_a_score_id_comes_from_its_rollout_and_version() -> None:
    env = load_environment(REVERSE_TEXT)
    rollout = RolloutCompleted(
        rollout_id="r0",
        group_id="g",
        task_id="t",
        env="reverse_text",
        answer="cba",
        completion=[{"role": "assistant", "content": "cba"}],
    )
    (first,) = await Scorer(env).score([rollout])
    (again,) = await Scorer(env).score([rollout])
    (named,) = await Scorer(env, "mine").score([rollout])
    assert first.scorer_version == rules_version(env) and named.scorer_version == "mine"
    assert first.event_id == again.event_id == derived_id("r0", "scored", rules_version(env))
    assert named.event_id == derived_id("r0", "scored", "mine") != first.event_id


def test_rescore_adds_a_version_and_both_stay_queryable(
    settings: Settings,  # noqa: F811
    evaluated: EvalResult,
) -> None:
    run = evaluated.run_id
    first = rules_version(load_environment(REVERSE_TEXT))
    assert evaluated.report.counted == {first: 6} and evaluated.report.mean_reward == 1.75

    result = rescore(load_environment(STRICTER), settings, run_id=run, show_progress=False)
    second = result.version
    assert second == rules_version(load_environment(STRICTER)) != first
    assert (result.selected, result.skipped, result.tally.rollouts) == (6, 0, 6)
    report = result.report
    assert (report.scorer_version, report.rollouts, report.mean_reward) == (second, 6, 1.0)
    assert report.rewards == {"exact": 1.0, "group_seen": 2.0}  # each group seen whole
    assert report.versions == {second: 6, first: 6}

    assert (
        count(settings, "SELECT count() FROM scored FINAL WHERE run_id = {run:String}", run) == 12
    )
    with open_store(settings.store.url, read_only=True) as store:
        latest = read_eval_summary(store, run, "reverse_text")  # each rollout's newest score
        assert (latest.mean_reward, latest.counted) == (1.0, {second: 6})
        assert read_eval_summary(store, run, "reverse_text", version=first).mean_reward == 1.75
        with pytest.raises(KeyError, match="no scores of reverse_text by scorer version 'nope'"):
            read_eval_summary(store, run, "reverse_text", version="nope")
        # The views count each rollout once: its newest score unless a version is chosen.
        for view, column, latest, earlier in (
            ("reward_by_step", "mean_reward", 1.0, 1.75),
            ("env_pass_rate", "mean_reward", 1.0, 1.75),
        ):
            where = "WHERE run_id = {run:String}"
            got = store.query(f"SELECT rollouts, {column} FROM {view} {where}", {"run": run})
            assert got.rows == [(6, latest)], view
            chosen = store.query(
                f"SELECT rollouts, {column} FROM {view}_at(version = {{v:String}}) {where}",
                {"run": run, "v": first},
            )
            assert chosen.rows == [(6, earlier)], view
        pass_at = store.query(
            "SELECT k, tasks, rollouts FROM pass_at_k WHERE run_id = {run:String} ORDER BY k",
            {"run": run},
        )
        assert pass_at.rows == [(1, 3, 6), (2, 3, 6)]

    again = rescore(load_environment(STRICTER), settings, run_id=run, show_progress=False)
    assert (again.version, again.skipped, again.tally.rollouts) == (second, 6, 0)
    assert (
        count(settings, "SELECT count() FROM scored FINAL WHERE run_id = {run:String}", run) == 12
    )


def test_the_ui_shows_each_rollouts_newest_score_or_a_chosen_version(
    settings: Settings,  # noqa: F811
    evaluated: EvalResult,
) -> None:
    run = evaluated.run_id
    first = rules_version(load_environment(REVERSE_TEXT))
    second = rescore(load_environment(STRICTER), settings, run_id=run, show_progress=False).version
    with ServerThread(create_app(settings.store.url), lifespan="on") as ui:
        latest = httpx.get(f"{ui.url}/runs/{run}", timeout=60)
        chosen = httpx.get(f"{ui.url}/runs/{run}", params={"version": first}, timeout=60)
        runs = httpx.get(f"{ui.url}/", timeout=60)
    assert latest.status_code == chosen.status_code == runs.status_code == 200
    assert (
        f"all · version -1: {format_number(1.0)}</title>" in latest.text
    )  # unknown: an outside endpoint
    assert f"all · version -1: {format_number(1.75)}</title>" in chosen.text
    assert f"all · version -1: {format_number(1.0)}</title>" not in chosen.text
    for version in (first, second):
        assert f'<option value="{version}"' in latest.text
    assert f'<option value="{first}" selected>' in chosen.text
    row = re.search(rf'<a href="/runs/{run}">.*?</tr>', runs.text, re.S)
    assert row is not None and f">{format_number(1.0)} <small>@v-1</small>" in row.group(0)


def test_where_selects_rollouts_and_group_rewards_see_the_stored_group(
    settings: Settings,  # noqa: F811
    upstream: ScriptedServer,  # noqa: F811
) -> None:
    run = evaluate(settings, REVERSE_TEXT, upstream, n=3, group_size=2).run_id
    result = rescore(
        load_environment(STRICTER),
        settings,
        run_id=run,
        where="sample_index = 0 AND status = 'ok'",
        version="first-samples",
        show_progress=False,
    )
    assert (result.selected, result.tally.rollouts, result.version) == (3, 3, "first-samples")
    assert result.report.rewards["group_seen"] == 2.0
    # By default each rollout counts with its newest score: three rescored, three as they were.
    original = rules_version(load_environment(REVERSE_TEXT))
    with open_store(settings.store.url, read_only=True) as store:
        latest = read_eval_summary(store, run, "reverse_text")
        view = store.query(
            "SELECT rollouts, mean_reward FROM reward_by_step WHERE run_id = {run:String}",
            {"run": run},
        )
    assert latest.counted == {"first-samples": 3, original: 3}
    assert latest.mean_reward == view.rows[0][1] == (3 * 1.0 + 3 * 1.75) / 6
    assert view.rows[0][0] == 6
    picked = rows(
        settings,
        "SELECT sample_index, count() FROM scored FINAL WHERE run_id = {run:String} "
        "AND scorer_version = 'first-samples' GROUP BY sample_index",
        run,
    )
    assert picked == [(0, 3)]


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("1) OR (1", "closes a parenthesis it never opened"),
        ("(status = 'ok'", "leaves 1 parenthesis(es) open"),
        ("status = 'ok'; SELECT 1", "has a ';'"),
        ("status = 'ok", "cannot be read: unterminated ' quote"),
        ("no_such_column = 1", "no_such_column"),
        ("task_id = 'nothing'", "no stored rollouts of reverse_text in run"),
    ],
)
def test_a_bad_or_empty_selection_is_refused_with_the_reason(
    settings: Settings,  # noqa: F811
    evaluated: EvalResult,
    where: str,
    message: str,
) -> None:
    with pytest.raises(RescoreError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rescore(
            load_environment(STRICTER),
            settings,
            run_id=evaluated.run_id,
            where=where,
            show_progress=False,
        )


def test_cli_rescores_as_a_named_version_with_a_summary(
    settings: Settings,  # noqa: F811
    evaluated: EvalResult,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app, worker_app = typer.Typer(), typer.Typer()
    app.callback()(lambda: None)
    rescore_command.register(app, worker_app)
    for key, value in {
        "RLBUS_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "RLBUS_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
        "RLBUS_STORE__URL": settings.store.url,
        "RLBUS_CLAIM_CHECK__URL": settings.claim_check.url,
    }.items():
        monkeypatch.setenv(key, value)
    name = f"cli-{uuid.uuid4().hex[:6]}"
    args = ["rescore", STRICTER, "--run", evaluated.run_id, "--where", "sample_index = 1"]
    out = CliRunner().invoke(app, [*args, "--as", name], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert f"rescored as {name}" in out.output and "rescored now" in out.output
    assert "mean reward" in out.output and "exact" in out.output
    bad = CliRunner().invoke(
        app, [*args[:4], "--where", "1)", "--as", name], env={"COLUMNS": "200"}
    )
    assert bad.exit_code == 2 and "closes a parenthesis" in bad.output
    named = CliRunner().invoke(app, [*args, "--as", "no spaces"], env={"COLUMNS": "200"})
    assert named.exit_code == 2 and "scorer version 'no spaces'" in named.output


async def test_resume_counts_rollouts_not_versions(settings: Settings) -> None:  # noqa: F811
    """--resume skips a task when every rollout of it is scored: one rollout of two scored by
    two versions is not every rollout."""
    run = f"resume-{uuid.uuid4().hex[:8]}"
    scores = [
        RolloutScored(
            event_id=derived_id("r0", "scored", version),
            run_id=run,
            rollout_id="r0",
            group_id="g",
            task_id="t",
            env="reverse_text",
            group_size=2,
            scorer_version=version,
        )
        for version in ("a", "b")
    ]
    async with Bus.of(settings) as bus:
        await bus.publish_many(scores)
    query = "SELECT count() FROM scored FINAL WHERE run_id = {run:String}"
    wait_for(lambda: count(settings, query, run) == 2, 60, "both scores in the store")
    with open_store(settings.store.url, read_only=True) as store:
        assert scored_tasks(store, run, "reverse_text") == set()
