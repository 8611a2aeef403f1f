"""An SFT warm start for a chat model on reverse_text, before RL (what prime-rl's reverse_text
example does with its reversal data set): a scripted teacher answers training tasks right through
the same env producer, interception server, judge and sink as any model, with the model's own
tokenizer and chat template; `rlbus replay sft` trains on those rollouts' stored token ids; the
RL run then starts from the model it wrote.

    python examples/reverse_text/warm_start.py --model models/smollm2 --out models/smollm2-sft
    rlbus run examples/reverse_text/smollm2.toml --model models/smollm2-sft --run-id warm

The tasks come from the RL config's environment and training split (its held_out_fraction), so
the RL run's held-out evaluation never sees one the teacher answered. Both stages are runs in the
store (PREFIX-teacher, PREFIX-sft)."""

from __future__ import annotations

import argparse
import asyncio
import tomllib
from pathlib import Path

from rlbus.config import deep_merge, load_settings
from rlbus.config.runs import ReplayConfig, load_run_config
from rlbus.console import console, progress
from rlbus.consumers.orchestrator.build import env_spec
from rlbus.discovery import local_broker
from rlbus.environment import load_environment
from rlbus.launch import recipe
from rlbus.launch.local_sink import local_sink
from rlbus.launch.quickstart import NOTE
from rlbus.launch.replay_sft import Selection, replay_sft

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="the chat model to warm up")
    parser.add_argument("--out", type=Path, required=True, help="where the SFT model is written")
    parser.add_argument("--rl-config", type=Path, default=HERE / "smollm2.toml")
    parser.add_argument("--sft-config", type=Path, default=HERE / "smollm2-sft.toml")
    parser.add_argument("--env", default="reverse_text", help="the RL config's environment")
    parser.add_argument(
        "--tasks", type=int, default=1024, help="training tasks the teacher answers"
    )
    parser.add_argument("--run-id", default="warm-start", help="prefix of the two stages' runs")
    args = parser.parse_args()

    rl = load_run_config(args.rl_config, ["--model", str(args.model)])
    settings = rl.base()
    entry = rl.envs[args.env]
    spec = env_spec(entry, args.rl_config.parent)
    env = load_environment(spec, entry.overrides)
    teacher_run, sft_run = f"{args.run_id}-teacher", f"{args.run_id}-sft"
    tasks = recipe.train_tasks(env, teacher_run, args.tasks, rl.orchestrator.held_out_fraction)
    teacher = recipe.chat_teacher(args.model, recipe.reversed_last_word)
    with local_broker(settings) as (live, _), local_sink(live) as sink:
        with progress(NOTE) as bars:
            task = bars.add_task("teacher", total=len(tasks), note="")
            scored = asyncio.run(
                recipe.collect_teacher(
                    live.model_copy(update={"run_id": teacher_run}),
                    teacher,
                    args.model,
                    sink,
                    len(tasks),
                    tasks,
                    env_spec=spec,
                    overrides=entry.overrides,
                    on_count=lambda done: bars.update(task, completed=done),
                )
            )
    console.print(f"teacher: {scored} rollouts of {teacher_run} scored")

    with args.sft_config.open("rb") as f:
        table = tomllib.load(f)
    replay = load_settings(
        overrides=deep_merge(deep_merge(settings.model_dump(), table), {"run_id": sft_run}),
        model=ReplayConfig,
    )
    with progress(NOTE) as bars:
        task = bars.add_task("sft", total=replay.steps, note="")
        result = replay_sft(
            replay,
            Selection(f"reward >= 1 AND env = '{env.id}'", teacher_run),
            args.model,
            args.out,
            on_step=lambda _, step: bars.update(task, advance=1, note=f"loss {step.loss:.3f}"),
        )
    losses = [r.loss for r in result.results]
    console.print(
        f"sft: {len(result.stored.samples)} samples, {replay.steps} steps of "
        f"{replay.batch_size}, loss {losses[0]:.3f} -> {losses[-1]:.3f}; the model is in "
        f"{args.out}"
    )


if __name__ == "__main__":
    main()
