"""Learning through the event log vs a bare in-process loop, same recipe, same run.

    python bench/learning.py [--example reverse_text|caesar] [--steps 100] [--workdir DIR]

1. a tiny model from `rlbus model init`; a scripted teacher answers training tasks through
   the env producer / judge / sink pipeline; SFT on those rollouts replayed from ClickHouse;
2. GRPO from the SFT model through rlbus (`rlbus run`: broker, store, inference, env
   producer, judge, orchestrator, trainer, sink as separate processes);
3. the same GRPO as a bare loop in one process (HF generate + the same trainer step, no bus);
4. held-out exact match of both at the same evaluation points, on the same held-out tasks.

Prints both curves, writes a PNG and the RL run's `rlbus report`, and as its last line
`RESULT time_to_reward_vs_bare=<ratio> reward_gain=<absolute>` (reward_gain: rlbus's held-out
exact match at the end minus at the SFT start).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from recipe import BY_NAME, Example
from rich.console import Console
from rich.table import Table

from rlbus.bus import EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.config import load_settings
from rlbus.config.runs import ReplayConfig, RunConfig
from rlbus.config.trainer import TrainerConfig
from rlbus.consumers.orchestrator.algorithms import AlgorithmConfig, group_advantages
from rlbus.consumers.orchestrator.stored_samples import stored_samples
from rlbus.consumers.trainer.policy import load_policy
from rlbus.consumers.trainer.sft import train_sft
from rlbus.consumers.trainer.step import Trainer
from rlbus.environment import Scorer, load_environment
from rlbus.launch import recipe
from rlbus.launch.local_sink import local_sink
from rlbus.launch.supervisor import LocalRun
from rlbus.schemas import RolloutCompleted, TrainSample, masks
from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens
from rlbus.ui.charts import Series
from rlbus.ui.figures import Figure
from rlbus.ui.report import png, write_report

console = Console()


def settings_for(workdir: Path, bootstrap: str, run_id: str) -> dict:
    return {
        "run_id": run_id,
        "kafka": {"bootstrap_servers": bootstrap},
        "store": {"url": f"chdb://{workdir / 'store'}"},
        "claim_check": {"url": str(workdir / "claims")},
    }


def sft_stage(
    example: Example, workdir: Path, bootstrap: str, teacher_tasks: int, sft: ReplayConfig
) -> tuple[Path, float]:
    """Teacher rollouts -> store -> SFT model; returns its path and the seconds it took."""
    started = time.monotonic()
    init = recipe.init_terse_model(workdir / "init", seed=0)
    settings = load_settings(overrides=settings_for(workdir, bootstrap, "teacher"))
    env = load_environment(example.env_path)
    tasks = recipe.train_tasks(env, settings.run_id, teacher_tasks)
    with local_sink(settings) as sink:
        scored = asyncio.run(
            recipe.collect_teacher(
                settings, example.teacher, init, sink, len(tasks), tasks, example.env_path
            )
        )
    with open_store(settings.store.url, read_only=True) as store:
        samples = asyncio.run(
            stored_samples(store, f"reward >= 1 AND env = '{example.name}'", "teacher")
        ).samples
    console.print(f"teacher: {scored} rollouts scored, {len(samples)} SFT samples from the store")
    out = workdir / "sft"
    results = train_sft(
        samples, init, out, sft.trainer, steps=sft.steps, batch_size=sft.batch_size, seed=sft.seed
    )
    console.print(
        f"SFT: {sft.steps} steps of {sft.batch_size}, loss {results[0].loss:.3f} -> "
        f"{results[-1].loss:.3f}"
    )
    return out, time.monotonic() - started


def rl_overrides(
    workdir: Path, model: Path, steps: int, run_id: str, eval_every: int, eval_tasks: int
) -> list[str]:
    return [
        "--model",
        str(model),
        "--max-steps",
        str(steps),
        "--run-id",
        run_id,
        "--store.url",
        f"chdb://{workdir / 'store'}",
        "--claim-check.url",
        str(workdir / "claims"),
        "--orchestrator.eval-every",
        str(eval_every),
        "--orchestrator.eval-tasks",
        str(eval_tasks),
    ]


def rlbus_stage(
    example: Example,
    workdir: Path,
    bootstrap: str,
    model: Path,
    steps: int,
    eval_every: int,
    eval_tasks: int,
) -> tuple[list[tuple[float, int, float]], float, list[tuple]]:
    """GRPO through rlbus; returns [(seconds since start, version, held-out exact)], wall seconds,
    reward curve."""
    overrides = [
        *rl_overrides(workdir, model, steps, "rl", eval_every, eval_tasks),
        "--kafka.bootstrap-servers",
        bootstrap,
    ]
    rl_config = example.dir / "rl.toml"
    cfg = load_settings(rl_config, overrides, model=RunConfig)
    assert isinstance(cfg, RunConfig)
    started = time.time()
    code = LocalRun(cfg.check(), rl_config, overrides, resume=False, console=console).run(
        timeout_s=900
    )
    wall = time.time() - started
    if code != 0:
        raise RuntimeError(f"rlbus run exited {code}")
    with open_store(cfg.store.url, read_only=True) as store:
        rows = recipe.held_out(store, "rl")
        published = dict(
            store.query(
                "SELECT version, min(toUnixTimestamp64Micro(ts)) / 1e6 FROM weight_versions "
                "FINAL WHERE run_id = 'rl' GROUP BY version"
            ).rows
        )
        curve = recipe.reward_curve(store, "rl")
    points = [(float(published.get(v, started)) - started, v, exact) for v, exact, _, _ in rows]
    return points, wall, curve


def bare_stage(
    example: Example,
    model: Path,
    steps: int,
    eval_every: int,
    eval_tasks: int,
    group_size: int,
    tasks_per_step: int,
    lr: float,
    max_tokens: int,
) -> list[tuple[float, int, float]]:
    """The same GRPO in one process: HF sampling, the env's own rewards, the same trainer step."""
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    env = load_environment(example.env_path)
    scorer = Scorer(env)
    tok = AutoTokenizer.from_pretrained(model)
    policy = load_policy(model, TrainerConfig().lora)
    cfg = TrainerConfig.model_validate({"optim": {"lr": lr}, "loss": {"name": "cross_entropy"}})
    trainer = Trainer(policy, cfg, steps)
    source = recipe.task_source(env, "bare")
    held = source.eval_set(0, eval_tasks, 1)

    def prompt_ids(task) -> list[int]:
        return tok.apply_chat_template(env.taskset.messages(task), add_generation_prompt=True)[
            "input_ids"
        ]

    @torch.no_grad()
    def sample(prompts: list[list[int]]) -> list[list[int]]:
        width = max(map(len, prompts))
        ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        policy.eval()
        out = policy.generate(
            input_ids=ids,
            attention_mask=attention,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            eos_token_id=recipe.IM_END,
            pad_token_id=tok.pad_token_id,
        )[:, width:].tolist()
        policy.train()
        return [row[: row.index(recipe.IM_END) + 1] if recipe.IM_END in row else row for row in out]

    def rewards(tasks, completions) -> list[tuple[float, float]]:
        rollouts = [
            RolloutCompleted(
                rollout_id=str(i),
                group_id=t.task_id,
                task_id=t.task_id,
                env=env.id,
                sample_index=i,
                group_size=len(tasks),
                answer=t.answer,
                completion=[
                    {"role": "assistant", "content": tok.decode(c, skip_special_tokens=True)}
                ],
            )
            for i, (t, c) in enumerate(zip(tasks, completions, strict=True))
        ]
        scored = asyncio.run(scorer.score(rollouts))
        return [(s.reward, s.rewards.get("exact", 0.0)) for s in scored]

    def evaluate() -> float:
        return (
            float(np.mean([r[1] for r in rewards(held, sample([prompt_ids(t) for t in held]))]))
            if held
            else 0.0
        )

    points = []
    started = time.monotonic()
    points.append((0.0, 0, evaluate()))
    eval_time = time.monotonic() - started
    for step in range(1, steps + 1):
        batch: list[TrainSample] = []
        tasks = [source.next_train() for _ in range(tasks_per_step)]
        for task in tasks:
            p = prompt_ids(task)
            completions = sample([p] * group_size)
            scored = asyncio.run(
                scorer.score(
                    [
                        RolloutCompleted(
                            rollout_id=str(i),
                            group_id=task.task_id,
                            task_id=task.task_id,
                            env=env.id,
                            sample_index=i,
                            group_size=group_size,
                            answer=task.answer,
                            completion=[
                                {
                                    "role": "assistant",
                                    "content": tok.decode(c, skip_special_tokens=True),
                                }
                            ],
                        )
                        for i, c in enumerate(completions)
                    ]
                )
            )
            adv = group_advantages(
                [s.reward for s in scored], [len(c) for c in completions], AlgorithmConfig()
            )
            for c, a in zip(completions, adv, strict=True):
                m = np.array([0] * len(p) + [masks.POLICY] * len(c), dtype=np.uint8)
                batch.append(
                    TrainSample(
                        rollout_id="",
                        input_ids=pack_tokens(p + c),
                        loss_mask=pack_mask(m),
                        advantages=pack_logprobs(m * np.float32(a)),
                        inference_logprobs=pack_logprobs(np.zeros(len(m))),
                    )
                )
        if any(np.any(np.frombuffer(s.advantages, np.float32)) for s in batch):
            trainer.step(batch)
        if step % eval_every == 0 or step == steps:
            t0 = time.monotonic()
            exact = evaluate()
            eval_time += time.monotonic() - t0
            # Evaluation time is not training time: the rlbus run evaluates in parallel.
            points.append((time.monotonic() - started - eval_time, step, exact))
            console.print(f"bare step {step}: held-out exact {exact:.3f}")
    return points


def time_to(points: list[tuple[float, int, float]], target: float) -> float | None:
    return next((t for t, _, exact in points if exact >= target), None)


def plot(path: Path, title: str, rl: list, bare: list, curve: list) -> None:
    """Drawn by `rlbus report`'s renderer (rlbus.ui.report.png)."""
    held_out = Figure(
        f"{title}: held-out exact match",
        "RL wall time (s)",
        "held-out exact match",
        "fraction 0-1",
        [
            Series(label, [(p[0], p[2]) for p in points])
            for points, label in (
                (rl, "rlbus (bus + store + processes)"),
                (bare, "bare in-process loop"),
            )
            if points
        ],
    )
    rollouts = Figure(
        "training rollouts (from ClickHouse)",
        "policy version that sampled the rollouts",
        "exact match; mean reward",
        "fraction 0-1; score",
        [
            Series("exact match", [(c[0], c[1]) for c in curve]),
            Series("reward (all of the env's rewards, weighted)", [(c[0], c[2]) for c in curve]),
        ],
    )
    path.write_bytes(png([held_out, rollouts], columns=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", choices=sorted(BY_NAME), default="reverse_text")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--eval-tasks", type=int, default=256)
    parser.add_argument(
        "--teacher-tasks",
        type=int,
        default=2048,
        help="more makes a stronger warm start: 4096 starts at ~0.69 held-out, leaving RL < 0.3 to "
        "gain",
    )
    parser.add_argument(
        "--sft-steps", type=int, default=None, help="default: the example's sft.toml"
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="default: EXAMPLE/learning.png")
    parser.add_argument("--skip-bare", action="store_true")
    args = parser.parse_args()
    example = BY_NAME[args.example]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rlbus-learning-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rl_cfg = load_settings(example.dir / "rl.toml", ["--model", "x"], model=RunConfig)
    assert isinstance(rl_cfg, RunConfig)
    env = load_environment(example.env_path, rl_cfg.envs[example.name].overrides)
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        sft_cfg = load_settings(
            example.dir / "sft.toml",
            [] if args.sft_steps is None else ["--steps", str(args.sft_steps)],
            model=ReplayConfig,
        )
        assert isinstance(sft_cfg, ReplayConfig)
        sft, sft_s = sft_stage(
            example, workdir, broker.bootstrap_servers, args.teacher_tasks, sft_cfg
        )
        rl, rl_wall, curve = rlbus_stage(
            example,
            workdir,
            broker.bootstrap_servers,
            sft,
            args.steps,
            args.eval_every,
            args.eval_tasks,
        )
    bare = (
        []
        if args.skip_bare
        else bare_stage(
            example,
            sft,
            args.steps,
            args.eval_every,
            args.eval_tasks,
            env.config.group_size,
            rl_cfg.orchestrator.tasks_per_step,
            rl_cfg.trainer.optim.lr,
            env.config.sampling.max_tokens or 16,
        )
    )
    table = Table(
        "version", "rlbus s", "rlbus exact", "bare s", "bare exact", title="held-out exact match"
    )
    bare_at = {v: (t, e) for t, v, e in bare}
    for t, v, e in rl:
        bt, be = bare_at.get(v, (float("nan"), float("nan")))
        table.add_row(str(v), f"{t:.1f}", f"{e:.3f}", f"{bt:.1f}", f"{be:.3f}")
    console.print(table)
    console.print(
        f"SFT stage {sft_s:.0f}s; rlbus RL wall time {rl_wall:.0f}s (startup and final eval "
        f"included)"
    )
    console.print(f"held-out exact match SQL:\n{recipe.HELD_OUT_SQL}")
    plot_path = args.plot or example.dir / "learning.png"
    plot(plot_path, example.name, rl, bare, curve)
    report = write_report(f"chdb://{workdir / 'store'}", "rl", workdir / "report")
    console.print(f"plot: {plot_path}; run report: {report.html}; store: {workdir / 'store'}")
    gain = rl[-1][2] - rl[0][2]
    ratio = float("nan")
    if bare:
        target = rl[0][2] + 0.9 * min(gain, bare[-1][2] - bare[0][2])
        t_rl, t_bare = time_to(rl, target), time_to(bare, target)
        console.print(f"target held-out exact {target:.3f}: rlbus {t_rl}s, bare {t_bare}s")
        if t_rl is not None and t_bare:
            ratio = t_rl / t_bare
            console.print(
                f"ratio without rlbus's process start-up ({rl[0][0]:.0f}s to version 0): "
                f"{(t_rl - rl[0][0]) / t_bare:.2f}"
            )
    print(f"RESULT time_to_reward_vs_bare={ratio:.2f} reward_gain={gain:.3f}")


if __name__ == "__main__":
    main()
