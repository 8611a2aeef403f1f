"""The experts recipe side by side (issue 34): from one base, (a) one RL expert per environment,
(b) one student distilled on-policy from both experts, (c) one GRPO run on both environments at
once; each a `rlbus run` of examples/experts/ (or the environments' smollm2.toml) on one store.

    python bench/experts.py [--model DIR] [--steps 30] [--eval-tasks 64] [--points 3]
                            [--workdir DIR] [--results DIR] [--stages N]

Steps: each expert trains `--steps`; the student and the joint run each train 2 x `--steps`, the
experts' total, so (b) and (c) are compared at equal trainer steps. Every run is evaluated by the
orchestrator (`--eval-tasks` held-out tasks of each environment) at version 0 and at `--points`
versions evenly spaced up to its last; the figures are the held-out mean reward per environment
read from the store (`held_out_by_env`), the table's at each run's last evaluated version. Wall
time counts each `rlbus run` from launch (start-up included). RESULTS.md (the table, the wall
times, the command) and experts.png (held-out reward against trainer steps, a panel per
environment) are written into `--results` (default: the workdir; examples/experts is where the
repository keeps them).

The four runs take hours on a small machine: `--stages N` runs N of them and stops; run again
with the same `--workdir` and the stages done there (stages.json: each one's wall time) are kept,
and one stopped midway goes on from its checkpoint (`rlbus run --resume`).

Last line: RESULT student_vs_experts=<min over environments of student / expert>
                  student_vs_joint=<min over environments of student / joint>
(issue 34 aims at >= 0.9 and >= 1.0.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
EXPERTS = {"reverse_text": "bx-expert-reverse-text", "chain_sum": "bx-expert-chain-sum"}
"""Each environment and its expert's run id."""
STUDENT, JOINT = "bx-student", "bx-joint"

console = Console()


def rlbus_run(
    config: Path, run_id: str, steps: int, args: argparse.Namespace, *extra: str
) -> float:
    """One `rlbus run` to its last step on the bench's store; its wall time in seconds (of
    this invocation: a run stopped midway before goes on from its checkpoint)."""
    from rlbus.consumers.trainer.checkpoint import CheckpointStore

    store = args.workdir / "store"
    checkpoints = args.workdir / "checkpoints" / run_id
    command = [
        str(Path(sys.executable).with_name("rlbus")), "run", str(config),
        "--model", str(args.model), "--run-id", run_id, "--max-steps", str(steps),
        "--store.url", f"chdb://{store}", "--claim-check.url", str(args.workdir / "claims"),
        "--trainer.checkpoint-url", str(checkpoints),
        "--orchestrator.eval-every", str(math.ceil(steps / max(1, args.points))),
        "--orchestrator.eval-tasks", str(args.eval_tasks),
        *extra,
    ]  # fmt: skip
    if CheckpointStore(str(checkpoints)).exists():
        command.append("--resume")
    log = args.workdir / f"{run_id}.log"
    started = time.monotonic()
    with log.open("a") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=args.workdir)
    if done.returncode != 0:
        raise SystemExit(f"rlbus run {run_id} exited {done.returncode}: see {log}")
    return time.monotonic() - started


def held_out(args: argparse.Namespace) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(run, env) -> (version, held-out mean reward) of each evaluation, oldest first."""
    from rlbus.bus.store import open_store

    runs = [*EXPERTS.values(), STUDENT, JOINT]
    with open_store(f"chdb://{args.workdir / 'store'}", read_only=True) as store:
        rows = store.query(
            "SELECT run_id, env, step, mean_reward FROM held_out_by_env "
            "WHERE run_id IN {runs:Array(String)} ORDER BY run_id, env, step",
            {"runs": runs},
        ).rows
    curves: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for run, env, step, reward in rows:
        curves.setdefault((str(run), str(env)), []).append((int(step), float(reward)))
    return curves


def curve_png(curves: dict[tuple[str, str], list[tuple[int, float]]]) -> bytes:
    """A panel per environment: its expert's, the student's and the joint run's curves."""
    from rlbus.ui.charts import Series
    from rlbus.ui.figures import Figure
    from rlbus.ui.report import png

    figures = []
    for env, expert in EXPERTS.items():
        runs = {"expert": expert, "student": STUDENT, "joint": JOINT}
        series = [Series(name, curves.get((run, env), [])) for name, run in runs.items()]
        title = f"{env}: held-out reward"
        figures.append(Figure(title, "trainer steps of the run", "mean reward", "0-1", series))
    return png(figures, columns=len(figures))


def ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None:
        return math.nan
    return a / b if b else math.inf if a else math.nan


def lowest(ratios: list[float]) -> float:
    """The minimum over environments; nan when one cannot be compared (a run with no reward)."""
    return math.nan if any(math.isnan(r) for r in ratios) else min(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="default: SmolLM2 imported into bench/out")
    parser.add_argument("--steps", type=int, default=30, help="trainer steps of each expert")
    parser.add_argument("--eval-tasks", type=int, default=64)
    parser.add_argument(
        "--points", type=int, default=3, help="evaluations of each run after version 0"
    )
    parser.add_argument("--workdir", type=Path, help="default: a temporary one")
    parser.add_argument("--results", type=Path, help="RESULTS.md's folder (default: --workdir)")
    parser.add_argument(
        "--stages",
        type=int,
        default=0,
        help="run at most this many of the stages not done yet in --workdir, then stop (0: all)",
    )
    args = parser.parse_args()
    if args.model is None:
        from real_model import default_model

        args.model = default_model()
    args.model = args.model.resolve()
    args.workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="experts-"))).resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    console.print(f"experts bench: {args.model.name}, {args.steps} steps an expert, {args.workdir}")

    student_teachers = [
        f"--envs.{env}.algorithm.teacher=run:{run}@latest" for env, run in EXPERTS.items()
    ]
    stages = [
        *((run, EXAMPLES / env / "smollm2.toml", args.steps, []) for env, run in EXPERTS.items()),
        (STUDENT, EXAMPLES / "experts" / "student.toml", 2 * args.steps, student_teachers),
        (JOINT, EXAMPLES / "experts" / "joint.toml", 2 * args.steps, []),
    ]
    done = args.workdir / "stages.json"
    wall = json.loads(done.read_text()) if done.exists() else {}
    todo = [stage for stage in stages if f"{stage[0]}@{stage[2]}" not in wall]
    if len(todo) < len(stages):
        console.print(f"{len(stages) - len(todo)} stages done before in {args.workdir}: kept")
    bar = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*bar, console=console) as progress:
        for run, config, steps, extra in todo[: args.stages or None]:
            task = progress.add_task(f"{run}: {steps} steps", total=1)
            wall[f"{run}@{steps}"] = rlbus_run(config, run, steps, args, *extra)
            done.write_text(json.dumps(wall))
            progress.update(task, completed=1)
    left = [run for run, _, steps, _ in stages if f"{run}@{steps}" not in wall]
    if left:
        raise SystemExit(f"stages left: {', '.join(left)}; run again with --workdir {args.workdir}")
    wall = {key.split("@")[0]: seconds for key, seconds in wall.items()}

    curves = held_out(args)
    last = {key: points[-1][1] for key, points in curves.items()}
    columns = ("environment", "expert", "student", "joint", "student / expert", "student / joint")
    rows, vs_experts, vs_joint = [], [], []
    for env, expert in EXPERTS.items():
        e, s, j = last.get((expert, env)), last.get((STUDENT, env)), last.get((JOINT, env))
        vs_experts.append(ratio(s, e))
        vs_joint.append(ratio(s, j))
        shown = [f"{v:.3f}" if v is not None else "-" for v in (e, s, j)]
        rows.append([env, *shown, f"{vs_experts[-1]:.2f}", f"{vs_joint[-1]:.2f}"])
    table = Table(title="held-out mean reward of each run's last version, by environment")
    for column in columns:
        table.add_column(column, justify="left" if column == "environment" else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    experts_s = sum(wall[r] for r in EXPERTS.values())
    each = ", ".join(f"{wall[r]:.0f}" for r in EXPERTS.values())
    walls = (
        f"wall time: experts {experts_s:.0f} s ({each}), "
        f"student {wall[STUDENT]:.0f} s (experts + student {experts_s + wall[STUDENT]:.0f} s), "
        f"joint {wall[JOINT]:.0f} s"
    )
    console.print(f"{walls}; runs and store in {args.workdir}")
    result = (
        f"RESULT student_vs_experts={lowest(vs_experts):.3f} "
        f"student_vs_joint={lowest(vs_joint):.3f} "
        f"expert_steps={args.steps} student_steps={2 * args.steps} joint_steps={2 * args.steps}"
    )
    results = (args.results or args.workdir).resolve()
    write_results(results, args, columns, rows, walls, result, curve_png(curves))
    console.print(f"RESULTS.md and experts.png in {results}")
    print(result)


def write_results(
    into: Path,
    args: argparse.Namespace,
    columns: tuple[str, ...],
    rows: list[list[str]],
    walls: str,
    result: str,
    curve: bytes,
) -> None:
    """RESULTS.md, with experts.png beside it: what ran, the table, the curve."""
    into.mkdir(parents=True, exist_ok=True)
    (into / "experts.png").write_bytes(curve)
    command = " ".join(["python bench/experts.py", *sys.argv[1:]])
    lines = [
        "# The experts recipe, side by side",
        "",
        f"`{command}` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; model "
        f"{args.model.name}): each expert {args.steps} trainer steps on its environment, the "
        f"student and the joint run {2 * args.steps} each; {args.eval_tasks} held-out tasks of "
        "each environment per evaluation, read from the store (`held_out_by_env`).",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        f"`{result}`",
        "",
        f"{walls.capitalize()}.",
        "",
        "![held-out mean reward against trainer steps, a panel per environment](experts.png)",
        "",
        'The same from the store: `rlbus sql "SELECT env, run_id, step, round(mean_reward, 3) '
        "FROM held_out_by_env ORDER BY env, run_id, step\"` (with `--store.url` of the bench's "
        "workdir).",
        "",
    ]
    (into / "RESULTS.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
