"""Issue 34, items 2 and 3, on a tiny model: examples/experts/ as its README runs it. Two RL
experts from one base (the reverse_text and chain_sum SmolLM2 configs, two steps each), then the
student (`examples/experts/student.toml`) through `rlbus run`: each environment distilled from
its own expert, named by run and `@latest`, both LoRA teachers served by the run as adapters of
one engine, and the student's batches drawn from both environments."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from pathlib import Path

import pytest
from support.in_process import run_in_process
from support.isolated import module_settings

from rlbus.bus import EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.config import load_settings
from rlbus.config.runs import RunConfig
from rlbus.consumers.inference.model_init import init_model

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXPERTS = {"reverse_text": "reverse-text-smollm2", "chain_sum": "chain-sum-smollm2"}
"""Each environment and the run id its expert's config gives it."""
STEPS = 2


# Its own waits: two expert runs of up to 240 s and a student of up to 420 s (the file-wide 300 s
# cut it at 300 s on a slow host while it was progressing).
@pytest.mark.timeout(900)
def test_two_experts_then_a_student_distilled_from_both(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = module_settings(broker, tmp_path)
    base = tmp_path / "tiny"
    init_model(base, arch="llama", seed=0)
    for env in EXPERTS:
        config = EXAMPLES / env / "smollm2.toml"
        overrides = {
            **settings.model_dump(mode="json", exclude_none=True, exclude={"run_id"}),
            "model": str(base),
            "max_steps": STEPS,
            "orchestrator": {"tasks_per_step": 4, "eval_every": 0},
            "trainer": {"checkpoint_url": str(tmp_path / f"ckpt-{env}"), "threads": 1},
            "envs": {env: {"overrides": {"group_size": 4}}},
        }
        cfg = load_settings(config, model=RunConfig, overrides=overrides)
        asyncio.run(run_in_process(cfg, config.parent, timeout_s=240))

    student = [sys.executable, "-m", "rlbus", "run", str(EXAMPLES / "experts" / "student.toml")]
    student += ["--model", str(base), "--max-steps", str(STEPS), "--store.url", settings.store.url]
    student += ["--claim-check.url", str(tmp_path / "claims"), "--orchestrator.eval-every", "0"]
    student += ["--trainer.checkpoint-url", str(tmp_path / "ckpt-student")]
    for env in EXPERTS:
        student += [f"--envs.{env}.overrides.group-size", "4"]
    done = subprocess.run(student, capture_output=True, text=True, timeout=420, cwd=tmp_path)
    said = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, said
    logs = tmp_path / "store" / "runs" / "experts-student" / "logs"
    for env, expert in EXPERTS.items():
        assert f"teacher of {env}: run:{expert}@{STEPS} (adapter " in done.stdout, said
    # LoRA experts of one base: one server, one copy of the base, each teacher an adapter.
    assert [log.name for log in logs.glob("teacher*.log")] == ["teacher-adapters.log"]
    served = " ".join((logs / "teacher-adapters.log").read_text().split())
    adapters = ", ".join(f"teacher-{expert}-v{STEPS}" for expert in EXPERTS.values())
    assert f"(frozen), scoring with adapters {adapters}" in served, served[-2000:]
    with open_store(settings.store.url, read_only=True) as store:
        trained = store.query(
            "SELECT count(DISTINCT step) FROM train_steps FINAL WHERE run_id = 'experts-student'"
        ).rows
        envs = store.query(
            "SELECT DISTINCT env FROM scored FINAL WHERE run_id = 'experts-student' ORDER BY env"
        ).rows
        kl = store.query(
            "SELECT key, value FROM batches FINAL ARRAY JOIN mapKeys(metrics) AS key, "
            "mapValues(metrics) AS value WHERE run_id = 'experts-student' "
            "AND startsWith(key, 'teacher_kl.')"
        ).rows
    assert trained == [(STEPS,)], said
    assert envs == [(env,) for env in sorted(EXPERTS)], envs
    # Each batch says how far the student is from the teacher of each environment it drew on.
    assert kl and {key for key, _ in kl} <= {f"teacher_kl.{env}" for env in EXPERTS}, kl
    assert all(math.isfinite(value) and value != 0 for _, value in kl), kl
