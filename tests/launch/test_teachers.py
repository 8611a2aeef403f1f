"""Issue 34, item 1: a distillation teacher named by a stored version (`[envs.NAME.algorithm]
teacher = "run:RUN_ID@VERSION"`), against a real finished run in a real store. `rlbus run` writes
the version out (pinned when `@latest`), serves it on a frozen inference server of its own and
points the orchestrator at it; a teacher it cannot use refuses the run before anything starts,
naming the environment, the teacher and why."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from support.runs import EXAMPLE, run_args, run_config, said
from support.trained_runs import STEPS, Run, start_run
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlbus.bus import EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.bus.waiting import wait_for
from rlbus.config import ConfigError, load_settings
from rlbus.config.runs import RunConfig
from rlbus.consumers.inference.model_init import init_model
from rlbus.launch.model_export import export_version
from rlbus.launch.teachers import EXPORTED, TeacherError, prepare_teachers

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("expert-run")]  # one run, trained once

ENV = "reverse_text"
REFUSED_WITHIN_S = 60.0
"""A guard, not a speed assertion: a refused run starts no role and loads no model (unloaded it
refuses in a few seconds, most of them importing torch)."""


@pytest.fixture(scope="module")
def expert(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A finished two-step run: the teacher's versions 0-2 are in its store."""
    return start_run(broker, tmp_path_factory.mktemp("expert"), "qwen3", lora=False)


def with_teacher(run: Run, tmp: Path, teacher: str, base: str = "") -> RunConfig:
    """A student run on the expert's base and store, distilling `ENV` from `teacher`."""
    cfg = run_config(run.settings, run.base, tmp)
    entry = cfg.envs[ENV]
    algorithm = entry.algorithm.model_copy(
        update={"name": "opd", "teacher": teacher, "teacher_base": base}
    )
    envs = {ENV: entry.model_copy(update={"algorithm": algorithm})}
    return cfg.model_copy(update={"envs": envs, "run_id": "student"})


def logits(model_dir: Path) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model(torch.tensor([[3, 50, 60, 70, 80]])).logits


def test_latest_is_pinned_written_once_and_scores_as_the_version(
    expert: Run, tmp_path: Path
) -> None:
    cfg = with_teacher(expert, tmp_path, f"run:{expert.run_id}@latest")
    (teacher,) = prepare_teachers(cfg, tmp_path / "run")
    assert str(teacher.ref) == f"run:{expert.run_id}@{STEPS}" and teacher.envs == (ENV,)
    exported = export_version(expert.store, expert.ref(STEPS), tmp_path / "export", expert.base)
    assert torch.equal(logits(teacher.model_dir), logits(exported.out))
    assert not torch.equal(logits(teacher.model_dir), logits(expert.base))  # it trained
    written = (teacher.model_dir / EXPORTED).stat().st_mtime_ns
    (again,) = prepare_teachers(cfg, tmp_path / "run")  # a resumed run: reused
    assert again == teacher and (teacher.model_dir / EXPORTED).stat().st_mtime_ns == written


def test_teachers_that_cannot_teach_are_refused_with_the_reason(
    expert: Run, tmp_path: Path
) -> None:
    where = rf"envs\.{ENV}\.algorithm\.teacher = 'run:{expert.run_id}@"
    with pytest.raises(TeacherError, match=rf"{where}9'.*no weight version 9.*versions: 0-2"):
        prepare_teachers(with_teacher(expert, tmp_path, expert.ref(9)), tmp_path)
    with pytest.raises(TeacherError, match=r"'run:nobody@1'.*no run 'nobody'"):
        prepare_teachers(with_teacher(expert, tmp_path, "run:nobody@1"), tmp_path)
    # A base whose tokenizer gives other ids: the teacher would score other tokens.
    other = tmp_path / "other-tokenizer"
    shutil.copytree(expert.base, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<teacher-only>"])
    tokenizer.save_pretrained(other)
    bad = with_teacher(expert, tmp_path, expert.ref(1), str(other))
    with pytest.raises(TeacherError, match=rf"{where}1'.*tokenizer .* is not the student's"):
        prepare_teachers(bad, tmp_path)
    # A base of another architecture: the version's weights do not load onto it.
    llama = tmp_path / "llama"
    init_model(llama, arch="llama", seed=0)
    bad = with_teacher(expert, tmp_path, expert.ref(1), str(llama))
    with pytest.raises(TeacherError, match=rf"{where}1'.*does not fit the base"):
        prepare_teachers(bad, tmp_path)
    assert not (tmp_path / "teachers").exists()  # nothing written by any of them


def test_a_config_names_a_teacher_one_way(tmp_path: Path) -> None:
    def load(**algorithm: str) -> RunConfig:
        overrides = {"model": "m", "envs": {ENV: {"path": "p", "algorithm": algorithm}}}
        return load_settings(EXAMPLE / "rl.toml", model=RunConfig, overrides=overrides)

    with pytest.raises(ConfigError, match=rf"envs\.{ENV}\.algorithm\.teacher.*names no stored"):
        load(name="opd", teacher="expert@3")
    with pytest.raises(ConfigError, match="give one"):
        load(name="opd", teacher="run:expert@3", teacher_url="http://127.0.0.1:1/v1")


def test_rlbus_run_refuses_a_missing_teacher_before_any_role_starts(
    expert: Run, tmp_path: Path
) -> None:
    args = [*run_args(tmp_path, expert.base), "--store.url", expert.store]
    args += [f"--envs.{ENV}.algorithm.name", "opd", "--run-id", "refused-student"]
    args += [f"--envs.{ENV}.algorithm.teacher", expert.ref(7)]
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    seconds = time.monotonic() - started
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"run:{expert.run_id}@7" in done.stderr and "versions: 0-2" in done.stderr
    assert seconds < REFUSED_WITHIN_S, seconds
    logs = Path(expert.store.removeprefix("chdb://")) / "runs" / "refused-student" / "logs"
    assert not logs.exists() or not any(logs.iterdir())  # no role was started


def test_rlbus_run_serves_a_stored_teacher_and_distills_from_it(
    expert: Run, tmp_path: Path
) -> None:
    args = [*run_args(tmp_path, expert.base), "--store.url", expert.store, "--max-steps", "2"]
    args += [f"--envs.{ENV}.algorithm.name", "opd", "--run-id", "student"]
    args += [f"--envs.{ENV}.algorithm.teacher", f"run:{expert.run_id}@latest"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=420, cwd=tmp_path)
    said = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, said
    assert f"teacher of {ENV}: run:{expert.run_id}@{STEPS}" in done.stdout, said
    logs = Path(expert.store.removeprefix("chdb://")) / "runs" / "student" / "logs"
    served = " ".join((logs / f"teacher-{expert.run_id}-v{STEPS}.log").read_text().split())
    assert "its weights as loaded (frozen)" in served, served[-2000:]
    with open_store(expert.store, read_only=True) as store:
        steps = store.query(
            "SELECT count(DISTINCT step) FROM train_steps FINAL WHERE run_id = 'student'"
        ).rows
        # What the run's page and report show of its teachers.
        named = store.query(
            "SELECT process, detail FROM incidents FINAL WHERE run_id = 'student' "
            "AND incident = 'teacher'"
        ).rows
    assert steps == [(2,)], said
    teacher = f"run:{expert.run_id}@{STEPS}"
    assert named == [(f"teacher-{expert.run_id}-v{STEPS}", f"{teacher} teaches {ENV}")], named
    print(json.dumps({"student steps": steps[0][0], "teacher": f"run:{expert.run_id}@{STEPS}"}))


def test_a_killed_teacher_is_started_again_and_the_run_trains_every_step(
    expert: Run, tmp_path: Path
) -> None:
    """The teacher's server SIGKILLed once the first step is trained: `rlbus run` starts it again
    on its port (an incident says so), the orchestrator waits through its reload, and the run
    trains each of its steps once."""
    steps = 4
    args = [*run_args(tmp_path, expert.base), "--store.url", expert.store]
    args += ["--max-steps", str(steps), "--run-id", "student-killed"]
    args += [f"--envs.{ENV}.algorithm.name", "opd"]
    args += [f"--envs.{ENV}.algorithm.teacher", f"run:{expert.run_id}@latest"]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path
    )
    logs = Path(expert.store.removeprefix("chdb://")) / "runs" / "student-killed" / "logs"
    try:

        def running() -> None:
            if proc.poll() is not None:
                pytest.fail(f"rlbus run exited {proc.returncode}: {proc.communicate()[0][-3000:]}")

        wait_for(lambda: said(logs / "trainer.log", "step 1:"), 300, "step 1", check=running)
        (teacher,) = [
            pid
            for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if "--frozen" in Path(f"/proc/{pid}/cmdline").read_text()
        ]
        os.kill(int(teacher), signal.SIGKILL)
        out, _ = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-4000:]
    assert f"teacher teacher-{expert.run_id}-v{STEPS}: inference was killed" in out, out[-4000:]
    with open_store(expert.store, read_only=True) as store:
        trained = store.query(
            "SELECT step, count() FROM train_steps FINAL WHERE run_id = 'student-killed' "
            "GROUP BY step ORDER BY step"
        ).rows
        restarted = store.query(
            "SELECT process FROM incidents FINAL WHERE run_id = 'student-killed' "
            "AND incident = 'role-restarted'"
        ).rows
    assert trained == [(step, 1) for step in range(1, steps + 1)], trained
    assert restarted == [(f"teacher-{expert.run_id}-v{STEPS}",)], restarted
