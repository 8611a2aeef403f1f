"""rlbus against TRL's GRPOTrainer on the same pretrained model, task, rewards and settings,
each in turn on this machine, both evaluated by one shared held-out evaluation at the same
wall-clock points.

    python bench/vs_trl.py [--task reverse_text|chain_sum] [--minutes 14] [--model DIR]
        [--every 3.5] [--eval-tasks 128] [--no-lora] [--trl-only --trl-steps 2]  (a smoke test)
        [--reuse-trl]  (TRL's checkpoints of the last run, when only rlbus's side changed)

Defaults (LoRA rank 8 on every linear layer, lr 2e-4, 4 tasks x 8 samples, 32 tokens, 14 minutes
a side) keep the whole bench within ~40 minutes on 2 cores.

Both sides train on the environment's training split (rlbus's own held-out rule: a hash of the
task id, 5 %) with its system prompt, the environment's own weighted rewards (TRL calls them
through a small HTTP scorer this process serves, since its venv cannot import rlbus), group
size, learning rate, max tokens, temperature 1, no KL term, advantages = reward - group mean,
full fine-tune or LoRA alike. TRL runs in a venv of its own (bench/out/trl-venv, created here
when missing: trl 1.16 needs datasets>=4.7, which the project's test extra does not allow).

The held-out evaluation is one function for both (`evaluate`): plain `model.generate` with the
model's chat template, the environment's system prompt, temperature 1, `--max-tokens`, on the
same `--eval-tasks` held-out tasks, scored by the held-out reward (reverse_text: LCS partial
credit in [0, 1]; chain_sum: the final number right). It runs on TRL's checkpoints (saved at the
first step end past each wall-clock point) and on the rlbus weight version the trainer had
published by each point (weights/v*.safetensors, dated by their files), after both runs, so
neither side's evaluation costs the other training time. Wall clock counts from each side's
process launch (start-up included).

Last line: RESULT time_to_reward_vs_trl=<rlbus time / TRL time to TRL's final held-out reward>
                  reward_gain=<rlbus final - baseline> trl_gain=<TRL final - baseline>
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "vs_trl"
VENV = ROOT / "bench" / "out" / "trl-venv"
TRL_PACKAGES = ["trl==1.16.*", "datasets>=4.7", "transformers==5.24.*", "peft"]
HELD_OUT_FRACTION = 0.05  # rlbus's default orchestrator.held_out_fraction


# ---- TRL side: runs in the TRL venv, imports nothing of rlbus --------------------------------


def trl_side(args: argparse.Namespace) -> None:
    import urllib.request

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    t0 = args.t0
    out = Path(args.out)
    torch.set_num_threads(args.threads or torch.get_num_threads())
    rows = [json.loads(line) for line in Path(args.train).read_text().splitlines()]
    dataset = Dataset.from_list(rows)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)

    def reward(completions: list, answer: list, task_id: list, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        body = json.dumps({"texts": texts, "answers": answer, "task_ids": task_id}).encode()
        request = urllib.request.Request(args.scorer, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as reply:
            return json.loads(reply.read())["rewards"]

    points = [p * 60 for p in args.points]
    log = out / "points.jsonl"

    class WallClock(TrainerCallback):
        """Saves the model at the first step end past each wall-clock point; stops at the last."""

        def on_step_end(self, targs, state, control, **kwargs):
            elapsed = time.time() - t0
            due = [p for p in points if p <= elapsed]
            last = state.global_step >= args.trl_steps > 0
            if due or last:
                for p in due:
                    points.remove(p)
                path = out / f"step-{state.global_step:05d}"
                kwargs["model"].save_pretrained(path)  # under LoRA, the adapter alone
                tokenizer.save_pretrained(path)
                with log.open("a") as f:
                    f.write(
                        json.dumps(
                            {"elapsed_s": elapsed, "step": state.global_step, "path": str(path)}
                        )
                        + "\n"
                    )
            if not points or last:
                control.should_training_stop = True
            return control

    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"
        )
    config = GRPOConfig(
        output_dir=str(out / "trainer"),
        learning_rate=args.lr,
        per_device_train_batch_size=args.tasks_per_step * args.group_size,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,  # rlbus's GRPO has no KL term
        scale_rewards="none",  # rlbus: advantage = reward - group mean (normalize_std = false)
        max_steps=100_000,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=args.device == "cpu",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[WallClock()],
        peft_config=peft_config,
    )
    trainer.train()
    if args.lora:  # what the shared evaluation loads: each save's adapter merged into the base
        from peft import PeftModel

        for line in log.read_text().splitlines():
            path = Path(json.loads(line)["path"])
            base = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
            merged = PeftModel.from_pretrained(base, path).merge_and_unload()
            merged.save_pretrained(path)


# ---- the driver (the project's venv) ---------------------------------------------------------


def ensure_trl_venv() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/support
    from support.venvs import own_venv

    # torch first, pinned: from local disk a CPU build; a looser pin would pull CUDA wheels.
    return own_venv(VENV, [["torch==2.13.0"], TRL_PACKAGES], "import trl")


class Task:
    """The environment, its split and its scores, as both sides and the evaluation see them."""

    def __init__(self, name: str, eval_tasks: int):
        from rlbus.consumers.orchestrator.task_draw import is_held_out
        from rlbus.environment.loader import load_environment

        self.name = name
        self.dir = ROOT / "examples" / name
        self.env = load_environment(str(self.dir / "env.toml"))
        tasks = self.env.tasks("")
        self.held_out = list(
            tasks.select(lambda t: is_held_out(t.task_id, HELD_OUT_FRACTION)).take(eval_tasks)
        )
        self.by_id = {t.task_id: t for t in self.env.tasks("")}

    def train_rows(self) -> list[dict[str, Any]]:
        from rlbus.consumers.orchestrator.task_draw import is_held_out

        return [
            {"prompt": self.env.taskset.messages(t), "answer": t.answer, "task_id": t.task_id}
            for t in self.by_id.values()
            if not is_held_out(t.task_id, HELD_OUT_FRACTION)
        ]

    def rewards(self, texts: list[str], task_ids: list[str], group_size: int) -> list[float]:
        """The environment's training reward: its weighted rewards and group rewards (over
        consecutive runs of `group_size`, how TRL orders a prompt's samples)."""
        import asyncio

        rules, weights = self.env.rules, self.env.rules.weights

        async def score() -> list[float]:
            cards = []
            for text, tid in zip(texts, task_ids, strict=True):
                task = self.by_id[tid]
                available = {
                    "text": text,
                    "answer": task.answer,
                    "task": task,
                    "prompt": task.prompt,
                    "info": task.info,
                    "state": {},
                    "completion": [{"role": "assistant", "content": text}],
                }
                cards.append({r.name: float(await r(available)) for r in rules.rewards})
            for start in range(0, len(cards), group_size):
                group = slice(start, start + group_size)
                task = self.by_id[task_ids[start]]
                available = {
                    "texts": texts[group],
                    "rewards": cards[group],
                    "task": task,
                    "answer": task.answer,
                    "prompt": task.prompt,
                    "info": task.info,
                }
                for r in rules.group_rewards:
                    for card, value in zip(cards[group], await r(available), strict=True):
                        card[r.name] = float(value)
            return [sum(weights.get(k, 1.0) * v for k, v in c.items()) for c in cards]

        return asyncio.run(score())

    def held_out_reward(self, text: str, answer: str) -> float:
        if self.name == "reverse_text":
            from rlbus.environment.reverse_text import lcs_ratio

            return lcs_ratio(text.strip(), answer)
        return self.env.taskset.correct(text=text, answer=answer)


def load_version(model: Any, weights: Path) -> None:
    """Put a weight version of rlbus's trainer into `model` as the inference engine does: full
    weights matched parameter by parameter, or LoRA deltas merged onto the base weights."""
    import torch

    from rlbus.consumers.inference.adapters import AdapterMerger
    from rlbus.consumers.inference.checkpoint_reader import match_parameters, read_checkpoint

    checkpoint = read_checkpoint(str(weights))
    if checkpoint.kind == "lora-delta":
        pairs = AdapterMerger(model).pairs(checkpoint.tensors, version=1)
    else:
        pairs = match_parameters(model, checkpoint.tensors)
    with torch.no_grad():
        for param, tensor in pairs:
            param.copy_(tensor)


def evaluate(model_dir: Path, weights: Path | None, task: Task, max_tokens: int) -> float:
    """Mean held-out reward of a model (optionally with a weights version of rlbus's trainer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if weights is not None:
        load_version(model, weights)
    torch.manual_seed(0)
    tokenizer.padding_side = "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    scores = []
    for start in range(0, len(task.held_out), 64):
        chunk = task.held_out[start : start + 64]
        prompts = [
            tokenizer.apply_chat_template(
                task.env.taskset.messages(t), add_generation_prompt=True, tokenize=False
            )
            for t in chunk
        ]
        batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(
                **batch,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_tokens,
                pad_token_id=pad,
            )
        for t, ids in zip(chunk, out[:, batch["input_ids"].shape[1] :], strict=True):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            scores.append(task.held_out_reward(text, t.answer))
    return sum(scores) / len(scores)


def serve_scorer(task: Task, group_size: int) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            rewards = task.rewards(body["texts"], body["task_ids"], group_size)
            reply = json.dumps({"rewards": rewards}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/score"


def run_trl(args: argparse.Namespace, task: Task, points: list[float]) -> list[tuple[float, Path]]:
    out = OUT / "trl"
    if args.reuse_trl:
        return trl_saves(out)
    python = ensure_trl_venv()
    out.mkdir(parents=True, exist_ok=True)
    (out / "points.jsonl").unlink(missing_ok=True)
    train = out / "train.jsonl"
    train.write_text("\n".join(json.dumps(r) for r in task.train_rows()))
    server, url = serve_scorer(task, args.group_size)
    command = [
        python, __file__, "--trl-side", f"--t0={time.time()}", f"--out={out}",
        f"--train={train}", f"--scorer={url}", f"--model={args.model}",
        f"--points={','.join(str(p) for p in points)}", *common_flags(args),
    ]  # fmt: skip
    try:
        subprocess.run(command, check=True, timeout=args.minutes * 60 + 1800)
    finally:
        server.shutdown()
    return trl_saves(out)


def trl_saves(out: Path) -> list[tuple[float, Path]]:
    """(seconds from launch, checkpoint) of each point TRL's side saved."""
    saved = [json.loads(line) for line in (out / "points.jsonl").read_text().splitlines()]
    return [(s["elapsed_s"], Path(s["path"])) for s in saved]


def run_rlbus(
    args: argparse.Namespace, task: Task, points: list[float]
) -> list[tuple[float, Path]]:
    out = OUT / "rlbus"
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / f"ckpt-{int(time.time())}"
    env = f"envs.{task.name}"
    rlbus = str(Path(sys.executable).with_name("rlbus"))
    command = [
        rlbus, "run", str(task.dir / "smollm2.toml"), "--model", str(args.model),
        "--run_id", f"vs-trl-{int(time.time())}", "--max_steps", "100000",
        "--trainer.checkpoint_url", str(ckpt), "--trainer.keep_weights", "100000",
        "--trainer.optim.lr", str(args.lr), "--trainer.device", args.device,
        "--trainer.lora.enabled", str(args.lora).lower(),
        "--orchestrator.tasks_per_step", str(args.tasks_per_step),
        "--orchestrator.drop_zero_signal", "false",  # TRL trains on every group
        "--orchestrator.eval_every", "0",  # the shared evaluation runs afterwards
        f"--{env}.overrides.group_size", str(args.group_size),
        f"--{env}.overrides.sampling.max_tokens", str(args.max_tokens),
        f"--{env}.overrides.sampling.temperature", "1.0",
    ]  # fmt: skip
    started = time.time()
    with open(out / "run.log", "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=out)
        try:
            proc.wait(timeout=args.minutes * 60)
        except subprocess.TimeoutExpired:
            # SIGTERM, as Ctrl-C: the roles stop, then the broker. (Not SIGINT: a shell ignores
            # it in background jobs, and so would rlbus run.)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()  # its roles get SIGTERM from the kernel as it dies
                proc.wait()
    files = sorted((ckpt / "weights").glob("v*.safetensors"))
    if proc.returncode not in (0, 130) or not files:
        # What it published still counts; say how it ended.
        print(f"rlbus run exited {proc.returncode} ({len(files)} versions): see {out / 'run.log'}")
    if not files:
        raise SystemExit("rlbus published no weights version")
    dated = [(f.stat().st_mtime - started, f) for f in files]
    picked = []
    for p in points:  # the newest version published by each point
        by_then = [d for d in dated if d[0] <= p * 60]
        if by_then and (not picked or picked[-1][1] != by_then[-1][1]):
            picked.append(by_then[-1])
    return picked


def common_flags(args: argparse.Namespace) -> list[str]:
    flags = [
        f"--lr={args.lr}", f"--group-size={args.group_size}", f"--max-tokens={args.max_tokens}",
        f"--tasks-per-step={args.tasks_per_step}", f"--device={args.device}",
        f"--threads={args.threads}", f"--trl-steps={args.trl_steps}",
    ]  # fmt: skip
    return [*flags, "--lora" if args.lora else "--no-lora"]


def first_reaching(curve: list[tuple[float, float]], target: float) -> float:
    return next((t for t, r in curve if r >= target - 1e-9), math.inf)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["reverse_text", "chain_sum"], default="reverse_text")
    parser.add_argument("--minutes", type=float, default=14, help="wall clock for each side")
    parser.add_argument("--every", type=float, default=3.5, help="minutes between eval points")
    parser.add_argument(
        "--model", type=Path, help="HF model directory (default: SmolLM2 imported into bench/out)"
    )
    parser.add_argument("--eval-tasks", type=int, default=128)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument(
        "--lr", type=float, help="learning rate (default: 2e-4 with LoRA, 3e-6 full fine-tune)"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--lora",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="LoRA (rank 8, all-linear) for both, or --no-lora: full fine-tune for both",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--trl-only", action="store_true", help="run TRL's side only")
    parser.add_argument("--trl-steps", type=int, default=0, help="stop TRL after N steps")
    parser.add_argument(
        "--reuse-trl",
        action="store_true",
        help="evaluate the TRL checkpoints of the last run (same settings) instead of training",
    )
    parser.add_argument("--trl-side", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--t0", "--out", "--train", "--scorer", "--points"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lr is None:
        args.lr = 2e-4 if args.lora else 3e-6
    if args.trl_side:
        args.t0 = float(args.t0)
        args.points = [float(p) for p in args.points.split(",")]
        trl_side(args)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    points = [args.every * i for i in range(1, int(args.minutes // args.every) + 1)]
    if not points or points[-1] < args.minutes:
        points.append(args.minutes)
    if args.model is None:
        from real_model import default_model

        args.model = default_model()
    task = Task(args.task, args.eval_tasks)
    console.print(
        f"{args.task}: {len(task.held_out)} held-out tasks; {args.tasks_per_step} tasks x "
        f"{args.group_size} samples a step, lr {args.lr}, {args.max_tokens} tokens, "
        f"{'LoRA' if args.lora else 'full fine-tune'}; {args.minutes} min each"
    )
    trl_saves = run_trl(args, task, points)
    rlbus_saves = [] if args.trl_only else run_rlbus(args, task, points)
    baseline = evaluate(args.model, None, task, args.max_tokens)
    trl_curve = [(0.0, baseline)] + [
        (t, evaluate(p, None, task, args.max_tokens)) for t, p in trl_saves
    ]
    rlbus_curve = [(0.0, baseline)] + [
        (t, evaluate(args.model, f, task, args.max_tokens)) for t, f in rlbus_saves
    ]
    table = Table("side", "minutes", "held-out reward", title=f"held-out reward ({args.task})")
    sides = [("TRL", trl_curve)] + ([] if args.trl_only else [("rlbus", rlbus_curve)])
    for side, curve in sides:
        for t, r in curve:
            table.add_row(side, f"{t / 60:.1f}", f"{r:.3f}")
    console.print(table)
    target = trl_curve[-1][1]
    trl_time = first_reaching(trl_curve, target)
    ratio = first_reaching(rlbus_curve, target) / trl_time if trl_time > 0 else math.nan
    rlbus_gain = rlbus_curve[-1][1] - baseline
    if args.trl_only:  # no rlbus run to compare with
        ratio = rlbus_gain = math.nan
    print(
        f"RESULT time_to_reward_vs_trl={ratio:.3f} "
        f"reward_gain={rlbus_gain:.3f} trl_gain={target - baseline:.3f}"
    )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
