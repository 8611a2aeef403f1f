"""Fault suite: every role, and the broker, killed once in the middle of work; what landed is
counted with SQL over the store, exactly.

1. training: `rlbus run`'s roles as processes (examples/reverse_text on a tiny model), and
   SIGKILL sink, env producer, judge, orchestrator, trainer and inference, one after another,
   each restarted, while the run goes on to its last step;
2. eval: `rlbus worker sink|env|judge` processes over tasks published to a run, the same three
   killed and restarted mid-stream;
3. the broker: `rlbus run` as a command, its embedded broker SIGKILLed: it must stop naming what
   was lost (acknowledged by the broker, not in the store), and `--resume` must finish the run.

With `--replicas N` (N > 1) parts 1 and 2 run N of every role that scales (env producers,
judges, sinks, inference replicas) and a standby orchestrator; one instance of each, and the
leading orchestrator, is SIGKILLed mid-run and not restarted: the others carry the run. (The
trainer, one per run, is killed only in the one-of-each mode; part 3 is the same at any N and
runs only there.) Also measured: the longest time no rollout was scored.

Counted per part: tasks published whose groups never completed, rollouts never scored,
trained samples whose rollout is not stored, steps missing or trained on nothing, ids stored
with two contents (the conflicts view).

    python bench/faults.py [--steps 16] [--tasks 64] [--workdir DIR] [--replicas N]
                           [--backend hf|vllm]

With `--backend vllm` the run's inference is vLLM (`rlbus engine install vllm` first), and part
1 kills it like the built-in engine (the other parts do not involve inference and are skipped).

Last line: RESULT lost=<n> conflicts=<n> empty_steps=<n> roles_survived=<k>/6
broker_loss_reported=<0|1>; with --replicas N > 1:
RESULT lost=<n> conflicts=<n> empty_steps=<n> stalled_s=<longest time no rollout was scored>
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlbus.bus import Bus
from rlbus.bus.store import open_store
from rlbus.bus.store.holder import holder_pid
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings, data_dir, load_settings, settings_variables
from rlbus.config.runs import RunConfig, load_run_config
from rlbus.consumers.inference.model_init import init_model
from rlbus.discovery import local_broker, store_served_elsewhere
from rlbus.launch.processes import RoleProcess
from rlbus.launch.supervisor import LocalRun
from rlbus.schemas import TaskPublished, group_id_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/support
from support import ScriptedServer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "reverse_text"
ROLES = ("env", "judge", "orchestrator", "trainer", "inference", "sink")
"""In the order they are killed. The sink goes last: training goes on without it, unseen (steps
are read from the store), and a restarted sink reads a backlog first, in which a tiny run can
pass its last step; every other role's restart holds the run up instead."""
ROLES_AT_N = ("orchestrator", "env", "judge", "inference", "sink")
"""With N of each: one instance of each killed, in this order, none restarted (the sink last,
for the reason above: the run goes on unseen while a standby takes the store over)."""
LEADS = "leading run"
"""What an orchestrator logs when it becomes the run's leader."""
finished = threading.Event()
"""Set between parts, when no process of the suite holds a store."""
console = Console()


@dataclass
class Tally:
    """What one part of the suite found."""

    part: str
    tasks: int = 0
    incomplete_groups: int = 0
    unscored: int = 0
    orphan_samples: int = 0
    missing_steps: int = 0
    empty_steps: int = 0
    conflicts: int = 0
    survived: list[str] = field(default_factory=list)
    stalled_s: float = 0.0
    """The longest time between two scores of the part's rollouts."""
    note: str = ""

    @property
    def lost(self) -> int:
        return self.incomplete_groups + self.unscored + self.orphan_samples + self.missing_steps


def query(settings: Settings, sql: str, **params: object) -> list[tuple]:
    """A read-only query through the sink's endpoint, retried while the store changes hands.
    While a run is on it never opens the directory itself: a chdb directory admits one process,
    and a reader holding it while the sink restarts would keep the sink out. Once nothing of
    the run is left (`finished`), it reads the directory directly."""
    deadline = time.monotonic() + 300
    while True:
        try:
            if finished.is_set() or store_served_elsewhere(settings):
                with open_store(settings.store.url, read_only=True) as store:
                    return store.query(sql, params).rows
        except Exception:  # the store's holder went away (killed, restarting): ask again
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no sink served {settings.store.url} for 300 s")
        time.sleep(0.5)


def count(settings: Settings, sql: str, **params: object) -> int:
    return int(query(settings, sql, **params)[0][0] or 0)


def settled(settings: Settings, run: str, tasks: list[TaskPublished], group_size: int) -> Tally:
    """Count, for `run`, what a lossless history must hold."""
    tally = Tally(run, tasks=len(tasks))
    rows = query(
        settings,
        "SELECT group_id, uniqExact(rollout_id) FROM rollouts FINAL WHERE run_id = {r:String} "
        "GROUP BY group_id",
        r=run,
    )
    per_group = dict(rows)
    tally.incomplete_groups = sum(
        per_group.get(group_id_of(t), 0) < (t.group_size or group_size) for t in tasks
    )
    tally.unscored = count(
        settings,
        "SELECT count() FROM (SELECT DISTINCT rollout_id FROM rollouts FINAL "
        "WHERE run_id = {r:String}) WHERE rollout_id NOT IN "
        "(SELECT rollout_id FROM scored FINAL WHERE run_id = {r:String})",
        r=run,
    )
    tally.conflicts = count(
        settings, "SELECT count() FROM conflicts WHERE run_id = {r:String}", r=run
    )
    scored_at = [
        r[0]
        for r in query(
            settings,
            "SELECT toFloat64(min(ts)) FROM scored FINAL WHERE run_id = {r:String} "
            "GROUP BY rollout_id ORDER BY 1",
            r=run,
        )
    ]
    tally.stalled_s = max((b - a for a, b in itertools.pairwise(scored_at)), default=0.0)
    return tally


def stored_tasks(settings: Settings, run: str, split: str = "train") -> list[TaskPublished]:
    rows = query(
        settings,
        "SELECT event_id, group_size FROM tasks FINAL "
        "WHERE run_id = {r:String} AND JSONExtractString(info, 'split') = {s:String}",
        r=run,
        s=split,
    )
    return [TaskPublished(event_id=i, task_id="", env="", prompt="", group_size=n) for i, n in rows]


def trained(settings: Settings, cfg: RunConfig, tally: Tally) -> None:
    """Steps and samples of a training run."""
    steps = dict(
        query(
            settings,
            "SELECT step, any(num_samples) FROM train_steps FINAL WHERE run_id = {r:String} "
            "GROUP BY step",
            r=cfg.run_id,
        )
    )
    tally.missing_steps = sum(s not in steps for s in range(1, cfg.max_steps + 1))
    tally.empty_steps = sum(n == 0 for n in steps.values())
    sampled = {
        r[0]
        for r in query(
            settings,
            "SELECT DISTINCT JSONExtractString(sample, 'rollout_id') FROM batches FINAL "
            "ARRAY JOIN JSONExtractArrayRaw(samples) AS sample WHERE run_id = {r:String}",
            r=cfg.run_id,
        )
    }
    stored = {
        r[0]
        for r in query(
            settings,
            "SELECT DISTINCT rollout_id FROM rollouts FINAL WHERE run_id = {r:String}",
            r=cfg.run_id,
        )
    }
    tally.orphan_samples = len(sampled - stored)


def step_of(settings: Settings, run: str) -> int:
    return count(settings, "SELECT max(step) FROM train_steps WHERE run_id = {r:String}", r=run)


def at_n(replicas: int) -> list[str]:
    """Overrides for `replicas` of every role that scales, and a standby orchestrator."""
    if replicas == 1:
        return []
    n = str(replicas)
    return [
        "--inference.replicas", n,
        "--sinks", n,
        "--envs.reverse_text.producers", n,
        "--envs.reverse_text.judges", n,
        "--orchestrator.standbys", str(replicas - 1),
    ]  # fmt: skip


def run_config(
    workdir: Path, model: Path, steps: int, run_id: str, replicas: int = 1, backend: str = "hf"
) -> tuple[Path, list[str]]:
    """The reverse_text recipe, small: a config file and the overrides every role gets."""
    overrides = [
        "--run-id", run_id,
        "--model", str(model),
        "--max-steps", str(steps),
        "--store.url", f"chdb://{workdir / 'store'}",
        "--claim-check.url", str(workdir / "claims"),
        "--orchestrator.tasks-per-step", "4",
        "--orchestrator.eval-every", "0",
        "--trainer.checkpoint-url", str(workdir / "checkpoints" / run_id),
        "--kafka.announce-every-s", "1",
        # A trainer killed before its first checkpoint has nothing to resume from.
        "--trainer.checkpoint-every", "2",
        "--inference.backend", backend,
        *at_n(replicas),
    ]  # fmt: skip
    return EXAMPLE / "rl.toml", overrides


def training_under_faults(workdir: Path, model: Path, steps: int, backend: str = "hf") -> Tally:
    """Part 1: each role SIGKILLed once and restarted while the run goes on."""
    config, overrides = run_config(workdir, model, steps, "faults-train", backend=backend)
    cfg = load_run_config(config, overrides)
    run = LocalRun(cfg, config, overrides, resume=False, console=console)
    survived: list[str] = []
    with local_broker(cfg.base()) as (base, _):
        try:
            roles = run.start_roles(base)
            wait_for(lambda: step_of(base, cfg.run_id) >= 1, 600, "the first step")
            for role in ROLES:
                before = step_of(base, cfg.run_id)
                if before >= cfg.max_steps:
                    console.print(f"step {before}: the run ended before {role} could be killed")
                    break
                process = next(p for p in run.processes if p.role == role)
                console.print(f"step {before}: SIGKILL {role} (process {process.proc.pid})")
                process.kill()
                time.sleep(2)
                process.restart(*(["--resume"] if role == "trainer" else []))
                goal = min(cfg.max_steps, before + 2)
                wait_for(
                    lambda goal=goal: step_of(base, cfg.run_id) >= goal,
                    600,
                    f"step {goal} after {role} restarted",
                )
                survived.append(role)
            roles.orchestrator.proc.wait(900)
            tally = settle(base, cfg, steps)
        finally:
            run.stop()
    tally.survived = survived
    return tally


def victim(role: str, processes: list[RoleProcess], settings: Settings) -> RoleProcess:
    """The instance of `role` to kill: the sink holding the store and the leading orchestrator
    (killing a standby would prove nothing), else the first one alive."""
    alive = [p for p in processes if p.role == role and p.alive()]
    if role == "sink":
        holder = holder_pid(data_dir(settings).resolve())
        return next(p for p in alive if p.proc.pid == holder)
    if role == "orchestrator":
        return next(p for p in alive if LEADS in p.log_path.read_text(errors="replace"))
    return alive[0]


def training_at_n(workdir: Path, model: Path, steps: int, replicas: int) -> Tally:
    """Part 1 at N: one instance of each scaled role, and the leading orchestrator, SIGKILLed
    while the run goes on; the others carry it to its last step."""
    config, overrides = run_config(workdir, model, steps, "faults-train-n", replicas)
    cfg = load_run_config(config, overrides)
    run = LocalRun(cfg, config, overrides, resume=False, console=console)
    survived: list[str] = []
    with local_broker(cfg.base()) as (base, _):
        try:
            roles = run.start_roles(base)

            def ended() -> bool:
                return any(p.proc.poll() == 0 for p in roles.orchestrators)

            wait_for(lambda: step_of(base, cfg.run_id) >= 1, 600, "the first step")
            for role in ROLES_AT_N:
                before = step_of(base, cfg.run_id)
                if before >= cfg.max_steps or ended():
                    console.print(f"step {before}: the run ended before {role} could be killed")
                    break
                process = victim(role, run.processes, base)
                console.print(f"step {before}: SIGKILL one {role} (process {process.proc.pid})")
                process.kill()
                goal = min(cfg.max_steps, before + 1)
                wait_for(
                    lambda goal=goal: ended() or step_of(base, cfg.run_id) >= goal,
                    600,
                    f"step {goal} after one {role} died",
                )
                survived.append(role)
            wait_for(ended, 900, "the run's end")
            tally = settle(base, cfg, steps)
        finally:
            run.stop()
    tally.survived = survived
    # What the env producers that lived to the end counted (each logs it when it stops).
    retried = [
        line.partition(" INFO ")[2]
        for p in run.processes
        if p.role == "env"
        for line in p.log_path.read_text(errors="replace").splitlines()
        if "made again on another inference replica" in line
    ]
    tally.note = "; ".join(retried)
    return tally


def settle(settings: Settings, cfg: RunConfig, steps: int) -> Tally:
    """Once the groups still on their way have landed: the run's tally."""
    group_size = cfg.envs["reverse_text"].overrides.get("group_size", 1)

    def complete() -> bool:
        tally = settled(settings, cfg.run_id, stored_tasks(settings, cfg.run_id), group_size)
        return tally.incomplete_groups == tally.unscored == 0

    try:
        wait_for(complete, 120, "the last groups to land", interval_s=2)
    except TimeoutError:
        pass  # counted below
    tally = settled(settings, cfg.run_id, stored_tasks(settings, cfg.run_id), group_size)
    trained(settings, cfg, tally)
    return tally


async def publish(settings: Settings, tasks: list[TaskPublished]) -> None:
    async with Bus.of(settings) as bus:
        for i in range(0, len(tasks), 8):
            await bus.publish_many(tasks[i : i + 8])
            await asyncio.sleep(0.25)  # a stream, so the kills land in the middle of it


def eval_under_faults(workdir: Path, n_tasks: int, base: Settings, replicas: int = 1) -> Tally:
    """Part 2: an eval pipeline's sink, env producer and judge each killed once mid-stream;
    restarted when they are the only one, left dead when `replicas` of each run."""
    run_id = "faults-eval"
    settings = base.model_copy(update={"run_id": run_id})
    logs = workdir / "eval-logs"
    with ScriptedServer() as upstream:
        env_args = [str(EXAMPLE), "--model", "scripted", "--base-url", f"{upstream.url}/v1"]
        args = {"sink": [], "env": env_args, "judge": [str(EXAMPLE)]}
        processes = [
            RoleProcess(role, settings, logs, role_args, name=f"{role}-{k}")
            for role, role_args in args.items()
            for k in range(1, replicas + 1)
        ]
        try:
            tasks = [
                TaskPublished(
                    task_id=f"t{i}", env="reverse_text", prompt=f"Reverse: word{i}", run_id=run_id
                )
                for i in range(n_tasks)
            ]
            publishing = subprocess_publish(settings, tasks)
            landed = "SELECT count() FROM scored FINAL WHERE run_id = {r:String}"
            for k, role in enumerate(("env", "judge", "sink")):
                target = (k + 1) * n_tasks // 5
                wait_for(lambda t=target: count(settings, landed, r=run_id) >= t, 600, "scores")
                process = victim(role, processes, settings)
                console.print(f"eval: SIGKILL {role} (process {process.proc.pid})")
                process.kill()
                if replicas == 1:
                    time.sleep(2)
                    process.restart()
            publishing.wait(600)
            tally = Tally(run_id)
            group_size = 4  # examples/reverse_text/env.toml

            def complete() -> bool:
                found = settled(settings, run_id, tasks, group_size)
                return found.incomplete_groups == found.unscored == 0

            try:
                wait_for(complete, 300, "every group scored", interval_s=2)
            except TimeoutError:
                pass
            tally = settled(settings, run_id, tasks, group_size)
            tally.survived = ["env", "judge", "sink"]
        finally:
            for process in processes:
                process.stop()
    return tally


def subprocess_publish(settings: Settings, tasks: list[TaskPublished]) -> subprocess.Popen:
    """Publish in a process of its own, as `rlbus tasks publish` would, while roles die."""
    import msgspec

    payload = msgspec.json.encode([msgspec.to_builtins(t) for t in tasks])
    code = (
        "import asyncio, sys, msgspec\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from faults import publish\n"
        "from rlbus.config import load_settings\n"
        "from rlbus.schemas import TaskPublished\n"
        "tasks = msgspec.json.decode(sys.stdin.buffer.read(), type=list[TaskPublished])\n"
        "asyncio.run(publish(load_settings(), tasks))\n"
    )
    env = {**os.environ, **settings_variables(settings)}
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(Path(__file__).parent)], stdin=subprocess.PIPE, env=env
    )
    assert process.stdin is not None
    process.stdin.write(payload)
    process.stdin.close()
    return process


def tansu_of(pid: int) -> int:
    """The Tansu process among `pid`'s children."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if "tansu" in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
                return int(child)
    raise RuntimeError(f"process {pid} runs no Tansu")


def broker_death(workdir: Path, model: Path, steps: int) -> tuple[bool, str, bool]:
    """Part 3: `rlbus run`'s broker killed mid-run; then `rlbus run --resume`. Returns whether
    the loss was reported, the report, and whether the resumed run finished."""
    config, overrides = run_config(workdir, model, steps, "faults-broker")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLBUS_")}
    command = [sys.executable, "-m", "rlbus", "run", str(config), *overrides]
    settings = load_settings(overrides={"store": {"url": f"chdb://{workdir / 'store'}"}})
    first = subprocess.Popen(
        command, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        wait_for(lambda: step_of(settings, "faults-broker") >= 2, 900, "step 2 of the run")
        tansu = tansu_of(first.pid)
        console.print(f"broker: SIGKILL Tansu (process {tansu}) under `rlbus run`")
        os.kill(tansu, signal.SIGKILL)
        out = first.communicate(timeout=180)[0].decode(errors="replace")
    finally:
        if first.poll() is None:
            first.kill()
    report = " ".join(out.split())
    reported = first.returncode == 1 and "Acknowledged by the broker but not in the store" in report
    resumed = subprocess.run(
        [*command, "--resume"], env=env, cwd=workdir, capture_output=True, timeout=1800
    )
    finished.set()
    done = resumed.returncode == 0 and step_of(settings, "faults-broker") == steps
    finished.clear()
    return reported, report[report.find("the broker") :][:400], done


def show(tally: Tally) -> None:
    table = Table(title=f"{tally.part}: what landed")
    figures = {
        "tasks": tally.tasks,
        "incomplete groups": tally.incomplete_groups,
        "unscored rollouts": tally.unscored,
        "orphan samples": tally.orphan_samples,
        "missing steps": tally.missing_steps,
        "empty steps": tally.empty_steps,
        "conflicts": tally.conflicts,
        "longest without a score (s)": f"{tally.stalled_s:.1f}",
    }
    for name in (*figures, "roles killed and back"):
        table.add_column(name, justify="right")
    table.add_row(*map(str, figures.values()), ", ".join(tally.survived))
    console.print(table)
    if tally.note:
        console.print(tally.note, markup=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps of parts 1 and 3")
    parser.add_argument("--tasks", type=int, default=64, help="eval tasks of part 2")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--parts", default="train,eval,broker", help="which parts to run")
    parser.add_argument(
        "--replicas", type=int, default=1, help="instances of each role that scales (parts 1, 2)"
    )
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf", help="inference engine")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if args.backend == "vllm":
        parts &= {"train"}
    if args.replicas > 1:
        parts.discard("broker")
    train = evals = Tally("skipped")
    reported = resumed = False
    with tempfile.TemporaryDirectory() as tmp:
        workdir = (args.workdir or Path(tmp)).resolve()
        model = workdir / "tiny"
        if not model.exists():
            init_model(model, seed=0)
        started = time.monotonic()
        if "train" in parts:
            if args.replicas > 1:
                train = training_at_n(workdir / "train", model, args.steps, args.replicas)
            else:
                train = training_under_faults(workdir / "train", model, args.steps, args.backend)
            show(train)
        if "eval" in parts:
            eval_settings = load_settings(
                overrides={
                    "store": {"url": f"chdb://{workdir / 'eval' / 'store'}"},
                    "claim_check": {"url": str(workdir / "eval" / "claims")},
                }
            )
            with local_broker(eval_settings) as (base, _):
                evals = eval_under_faults(workdir / "eval", args.tasks, base, args.replicas)
            show(evals)
        if "broker" in parts:
            (workdir / "broker").mkdir(parents=True, exist_ok=True)
            reported, report, resumed = broker_death(workdir / "broker", model, args.steps)
            console.print(f"broker death reported: {reported} ({report}); resumed: {resumed}")
        console.print(f"fault suite: {time.monotonic() - started:.0f} s")
    lost = train.lost + evals.lost
    conflicts = train.conflicts + evals.conflicts
    if args.replicas > 1:
        stalled = max(train.stalled_s, evals.stalled_s)
        print(
            f"RESULT lost={lost} conflicts={conflicts} empty_steps={train.empty_steps} "
            f"stalled_s={stalled:.1f}"
        )
        return
    survived = sum(role in train.survived for role in ROLES)
    print(
        f"RESULT lost={lost} conflicts={conflicts} empty_steps={train.empty_steps} "
        f"roles_survived={survived}/{len(ROLES)} broker_loss_reported={int(reported and resumed)}"
    )


if __name__ == "__main__":
    main()
