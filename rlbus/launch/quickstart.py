"""`rlbus quickstart` as a library call: the tiny-model recipe (rlbus.launch.recipe) end to end on
embedded defaults, a stage at a time, each with a progress bar, each a run in the store:

model (`rlbus model init`) -> tasks (published, in ClickHouse) -> baseline (held-out evaluation)
-> teacher (scripted answers to training tasks) -> sft (replayed from ClickHouse) -> rl (GRPO as
`rlbus run` does it: every role a process, weights reloaded hot, held-out evaluations at the
first and last version). With a model of one's own the model, teacher and SFT stages are skipped.
"""

from __future__ import annotations

import asyncio
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
from rich.progress import Progress, TextColumn

from rlbus.bus.store import Store, open_store
from rlbus.bus.store.reads.quickstart import COUNTS, LANDED, NEWEST_STEP, PRESENT
from rlbus.config import Settings, data_dir, deep_merge, load_settings
from rlbus.config.runs import ReplayConfig, RunConfig
from rlbus.console import console, progress
from rlbus.discovery import local_broker
from rlbus.environment import load_environment
from rlbus.environment.task_sources.publish import publish_tasks
from rlbus.launch import recipe
from rlbus.launch.local_sink import LocalSink, local_sink
from rlbus.launch.replay_sft import Selection, replay_sft
from rlbus.launch.supervisor import LocalRun, banner

ENV = "reverse_text"
OWN_MODEL_ENV = "rlbus.environment.reverse_text:ReverseText"
"""A model of one's own is asked with reverse_text's instruction (the terse task set's bare
word means nothing to a model that has not learned it)."""

RUN_DEFAULTS: dict[str, Any] = {
    "max_steps": 30,
    "orchestrator": {
        "mode": "async",
        "tasks_per_step": 16,
        "max_off_policy_steps": 2,
        "seq_len": 256,
        # 16 tasks x 8 samples a step, every group trained on (bench/learning.py's recipe).
        "drop_zero_signal": False,
        # Held-out evaluations at the first and the last version (the last is always one).
        "eval_every": 1000,
        "eval_tasks": 512,
    },
    "trainer": {
        "micro_batch_tokens": 8192,
        "threads": 1,
        "optim": {"lr": 3e-4, "max_grad_norm": 1.0},
        "loss": {"name": "rl", "trust_region": 0.2},
    },
    "envs": {
        ENV: {
            "path": recipe.TERSE_ENV,
            "algorithm": {"name": "grpo"},
            "overrides": {
                "group_size": 8,
                "max_concurrent_rollouts": 128,
                "sampling": {"temperature": 1.0, "max_tokens": 16},
            },
        }
    },
}
"""The RL stage's run config (written to the quickstart's directory as rl.toml; the user's
--config and overrides win). From the SFT warm start (held-out exact match ~0.5) the recipe's
GRPO passes 0.85 by step 20 (examples/reverse_text/RESULTS.md); 30 steps leave room."""

SFT_DEFAULTS: dict[str, Any] = {
    "batch_size": 64,
    # One thread: a second one adds little for a 0.9M-parameter model, and on a busy machine
    # torch's spinning threads made a step ten times slower.
    "trainer": {"threads": 1, "optim": {"lr": 3e-3, "warmup_steps": 10}},
}
"""The SFT stage: a short warm start (examples/reverse_text/sft.toml's rate), so that RL has
room to show what it adds."""

STAGES = ("model", "tasks", "baseline", "teacher", "sft", "rl")

NOTE = TextColumn("{task.fields[note]}")
"""What each stage's bar says beside its count: a reward, a loss."""


class QuickstartError(RuntimeError):
    """A quickstart that cannot start or finish; the message says what to do."""


@dataclass(frozen=True)
class Sizes:
    teacher_tasks: int = 2048
    """Training tasks the scripted teacher answers (the SFT data)."""
    sft_steps: int = 100
    """SFT optimizer steps of 64 samples."""


@dataclass(frozen=True)
class Runs:
    """The run ids of a quickstart's stages: PREFIX-baseline, -teacher, -sft, -rl."""

    prefix: str

    def of(self, stage: str) -> str:
        return f"{self.prefix}-{stage}"


@dataclass
class Stage:
    name: str
    run_id: str | None
    """The stage's run in the store (none: the model and tasks stages)."""
    seconds: float = 0.0
    skipped: str = ""
    """Why the stage did not run ('' when it did)."""
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class Result:
    runs: Runs
    stages: list[Stage]
    held_out: tuple[float, float, float]
    """Held-out mean reward: baseline, after SFT (the RL run's version 0), after RL."""
    exact: tuple[float, float, float]
    """Held-out exact match at the same three points."""
    held_out_rollouts: int
    """Rollouts of each held-out evaluation (tasks x eval_group_size)."""
    final_version: int
    seconds: float
    """The whole quickstart: the stages, the broker and sink starting and stopping, the figures
    read back."""
    rl_config: Path
    models: dict[str, Path]
    """The models made here (the tiny one from init, the SFT one), or the one given."""


class StepsBar:
    """The RL stage's progress bar as `LocalRun`'s live view: steps in the store, the latest
    training reward and held-out reward."""

    def __init__(self, bars: Progress, run_id: str, url: str, total: int):
        self.bars = bars
        self.run_id = run_id
        self.url = url
        self.task = bars.add_task("rl", total=total, note="")
        self.refreshed = 0.0

    def refresh(self) -> Progress:
        self.refreshed = time.monotonic()
        try:
            with open_store(self.url, read_only=True) as store:
                step = store.query(NEWEST_STEP, {"run": self.run_id}).rows[0][0]
                curve = recipe.reward_curve(store, self.run_id)
                evals = recipe.held_out(store, self.run_id)
        except Exception:  # the sink is not serving the store yet; the next refresh will tell
            return self.bars
        note = f"reward {curve[-1][2]:.3f}" if curve else ""
        if evals:
            note += "  held-out " + " → ".join(f"{reward:.3f}" for _, _, reward, _ in evals)
        self.bars.update(self.task, completed=step or 0, note=note)
        return self.bars


def counts(store: Store, run_id: str) -> dict[str, int]:
    return {
        name: int(store.query(sql, {"run": run_id}).rows[0][0] or 0) for name, sql in COUNTS.items()
    }


class Quickstart:
    def __init__(
        self,
        overrides: list[str],
        config: Path | None,
        model: Path | None,
        sizes: Sizes,
    ):
        """`overrides`: settings of every stage and of the RL run (--section.field VALUE);
        `model`: evaluate and train this model instead of making and warming up a tiny one."""
        self.overrides = overrides
        self.config = config
        self.own_model = model.resolve() if model else None
        self.sizes = sizes
        settings = load_settings(config, overrides, model=RunConfig)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        prefix = f"quickstart-{stamp}" if settings.run_id == "default" else settings.run_id
        self.runs = Runs(prefix)
        self.dir = data_dir(settings) / "quickstart" / prefix
        models = data_dir(settings) / "models"
        self.models = (
            {"given": self.own_model}
            if self.own_model
            else {"init": models / "tiny-terse", "sft": models / "reverse-sft"}
        )
        self.stages = {
            name: Stage(name, None if name in ("model", "tasks") else self.runs.of(name))
            for name in STAGES
        }
        if self.own_model:
            for name in ("model", "teacher", "sft"):
                self.stages[name].skipped = "--model"

    # The RL run's config is the source of every stage's settings: the same store, broker,
    # environment overrides and held-out split for the baseline as for the RL run.
    def _rl_config(self) -> tuple[Path, list[str], RunConfig]:
        """The RL run's config file, the overrides its roles get with it, and the config."""
        table = deep_merge(RUN_DEFAULTS, self._user_config())
        rl_model = self.own_model or self.models["sft"]
        table = deep_merge(table, {"model": str(rl_model)})
        if self.own_model:
            table = deep_merge(table, {"envs": {ENV: {"path": OWN_MODEL_ENV}}})
        path = self.dir / "rl.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(tomli_w.dumps(table))
        overrides = [*self.overrides, "--run-id", self.runs.of("rl")]
        cfg = load_settings(path, overrides, model=RunConfig).check()
        return path, overrides, cfg

    def _user_config(self) -> dict[str, Any]:
        if self.config is None:
            return {}
        with self.config.open("rb") as f:
            return tomllib.load(f)

    @contextmanager
    def _stage(self, name: str) -> Iterator[Stage]:
        stage = self.stages[name]
        started = time.monotonic()
        yield stage
        stage.seconds = time.monotonic() - started

    def run(self) -> Result:
        started = time.monotonic()
        path, overrides, cfg = self._rl_config()
        with local_broker(cfg.base()) as (live, _):
            console.print(banner(live, data_dir(live) / "logs"), markup=False)
            with local_sink(live) as sink:
                if present := sink.count(PRESENT, {"prefix": self.runs.prefix + "-"}):
                    raise QuickstartError(
                        f"the store already holds {present:,} tasks of quickstart "
                        f"{self.runs.prefix}; pass another --run-id"
                    )
                self._before_rl(live, cfg, sink)
            self._rl(cfg.model_copy(update={"kafka": live.kafka}), path, overrides)
        return self._result(cfg, path, started)

    def _before_rl(self, live: Settings, cfg: RunConfig, sink: LocalSink) -> None:
        entry, orchestrator = cfg.envs[ENV], cfg.orchestrator
        env = load_environment(entry.path, entry.overrides)
        baseline = live.model_copy(update={"run_id": self.runs.of("baseline")})
        teacher = live.model_copy(update={"run_id": self.runs.of("teacher")})
        fraction = orchestrator.held_out_fraction
        held_out = recipe.held_out_tasks(
            env, baseline.run_id, orchestrator.eval_tasks, fraction, orchestrator.eval_group_size
        )
        evaluated = len(held_out) * orchestrator.eval_group_size
        n_train = 0 if self.own_model else self.sizes.teacher_tasks
        train = recipe.train_tasks(env, teacher.run_id, n_train, fraction)
        model = self.own_model or self.models["init"]
        with progress(NOTE) as bars:

            def bar(stage: str, total: int) -> Callable[[int], None]:
                """A stage's bar, and what moves it to a count."""
                task = bars.add_task(stage, total=total, note="")
                return lambda done: bars.update(task, completed=done)

            if not self.own_model:
                with self._stage("model"):
                    made = bar("model", 1)
                    recipe.init_terse_model(model, seed=0)
                    made(1)
            with self._stage("tasks") as stage:
                tasks = [*held_out, *train]
                asyncio.run(publish_tasks(live, tasks))
                runs = {"runs": [baseline.run_id, teacher.run_id]}
                what = f"{len(tasks)} tasks of the quickstart in the store"
                sink.wait_landed(LANDED, runs, len(tasks), what, 120, bar("tasks", len(tasks)))
                stage.counts = {"events": sink.count(LANDED, runs)}
            with self._stage("baseline"):
                scored = bar("baseline", evaluated)
                asyncio.run(
                    recipe.evaluate(
                        baseline,
                        model,
                        sink,
                        evaluated,
                        env_spec=entry.path,
                        overrides=entry.overrides,
                        on_count=scored,
                    )
                )
                with open_store(live.store.url, read_only=True) as store:
                    ((_, _, reward, _),) = recipe.held_out(store, baseline.run_id)
                bars.update(bars.task_ids[-1], note=f"held-out reward {reward:.3f}")
            if self.own_model:
                return
            with self._stage("teacher"):
                asyncio.run(
                    recipe.collect_teacher(
                        teacher,
                        recipe.reverse_teacher,
                        model,
                        sink,
                        len(train),
                        env_spec=entry.path,
                        overrides=entry.overrides,
                        on_count=bar("teacher", len(train)),
                    )
                )
            with self._stage("sft"):
                task = bars.add_task("sft", total=self.sizes.sft_steps, note="")
                replay = load_settings(
                    overrides=deep_merge(
                        deep_merge(live.model_dump(), SFT_DEFAULTS),
                        {"run_id": self.runs.of("sft"), "steps": self.sizes.sft_steps},
                    ),
                    model=ReplayConfig,
                )
                replay_sft(
                    replay,
                    Selection(f"reward >= 1 AND env = '{env.id}'", teacher.run_id),
                    model,
                    self.models["sft"],
                    on_step=lambda _, step: bars.update(
                        task, advance=1, note=f"loss {step.loss:.3f}"
                    ),
                )

    def _rl(self, cfg: RunConfig, path: Path, overrides: list[str]) -> None:
        with self._stage("rl"):
            bars = progress(NOTE)
            view = StepsBar(bars, cfg.run_id, cfg.store.url, cfg.max_steps)
            code = LocalRun(cfg, path, overrides, False, console, view).run()
            view.refresh()
        if code != 0:
            raise QuickstartError(f"the RL run {cfg.run_id} ended with code {code}")

    def _result(self, cfg: RunConfig, path: Path, started: float) -> Result:
        with open_store(cfg.store.url, read_only=True) as store:
            for stage in self.stages.values():
                if stage.run_id and not stage.skipped:
                    stage.counts = counts(store, stage.run_id)
            baseline = recipe.held_out(store, self.runs.of("baseline"))
            rl = recipe.held_out(store, cfg.run_id)
        if len(baseline) != 1 or len(rl) < 2:
            raise QuickstartError(
                f"held-out evaluations missing in {cfg.store.url}: baseline {baseline}, rl {rl}"
            )
        (_, base_exact, base_reward, _), (first, last) = baseline[0], (rl[0], rl[-1])
        after_sft = (base_reward, base_exact) if self.own_model else (first[2], first[1])
        return Result(
            self.runs,
            list(self.stages.values()),
            (base_reward, after_sft[0], last[2]),
            (base_exact, after_sft[1], last[1]),
            baseline[0][3],
            last[0],
            time.monotonic() - started,
            path,
            self.models,
        )
