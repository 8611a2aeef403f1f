"""Issue 35, item 5, as a user meets it: a model that cannot fit is refused before it is loaded
(no weight read) and with its estimate, by every command that loads one (`rlbus run`, `rlbus worker
trainer`, `rlbus worker inference`); and Ctrl-C or SIGTERM stops a `rlbus run` whose roles are
still loading, it and every role gone within 10 s."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.model_configs import LLAMA_7B
from support.pids import alive
from support.runs import EXAMPLE, run_args, said

from rlbus.bus import free_port
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.sizing import serving_estimate
from rlbus.consumers.model_size import available_bytes, model_size
from rlbus.launch import processes
from rlbus.launch.processes import RoleProcess

REFUSED_WITHIN_S = 60.0
"""A guard against a command that loads the weights (minutes for a 7B on CPU), not a speed
assertion: what is asserted is that no weight is read. Unloaded here it refuses in 3.5-4.6 s; under
CI's load (four test workers on two cores) it took 11 s, most of it importing torch."""
STOPPED_WITHIN_S = 10.0
NOWHERE = "http://127.0.0.1:9/v1"
"""An inference URL where nothing answers: the producer is stopped before it calls one."""


LLAMA_70B = {
    **LLAMA_7B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}
"""Llama-2-70B's: what inference cannot serve on a machine with room for a 7B."""


def model_dir(path: Path, config: dict[str, Any], tokenizer_from: Path) -> Path:
    """A model directory as a user has one before its weights are downloaded: config.json and a
    tokenizer, no weights (what a refusal reads is the config alone)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tokenizer_from / name, path / name)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny"
    init_model(path, seed=0)
    return path


@pytest.fixture
def llama_7b(tmp_path: Path, tiny: Path) -> Path:
    return model_dir(tmp_path / "llama-7b", LLAMA_7B, tiny)


@pytest.fixture
def too_large_to_serve(tmp_path: Path, tiny: Path) -> Path:
    """The 7B, unless this machine could serve it (some have 64 GB free): then a 70B."""
    seven_b = model_dir(tmp_path / "llama-7b-serve", LLAMA_7B, tiny)
    size, free = model_size(seven_b), available_bytes("cpu")
    assert size is not None and free is not None
    serving = serving_estimate(size, "hf", "cpu")
    assert serving is not None
    if serving.total < free:
        return model_dir(tmp_path / "llama-70b", LLAMA_70B, tiny)
    return seven_b


def refused(what: str, code: int | None, seconds: float, output: str) -> str:
    """The refusal's message, its lines joined (the console wraps them to its width)."""
    said = " ".join(output.split())
    assert code not in (0, None), f"{what} exited {code}:\n{said[-3000:]}"
    assert seconds < REFUSED_WITHIN_S, f"{what} took {seconds:.1f}s to refuse:\n{said[-3000:]}"
    assert "would need ~" in said and "GB is available" in said, said[-3000:]
    assert "Loading weights" not in said, said[-3000:]
    return said


@pytest.mark.slow
def test_rlbus_run_refuses_a_model_that_cannot_fit_before_it_starts_a_role(
    llama_7b: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [*run_args(tmp_path, llama_7b), "--trainer.micro-batch-tokens", "1024"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    seconds = time.monotonic() - started
    said = refused("rlbus run", done.returncode, seconds, done.stdout + done.stderr)
    assert "this run would need ~" in said and "trainer.lora.enabled = true" in said
    assert not (tmp_path / "store" / "runs" / "cli" / "logs").exists()  # no role started
    print(f"rlbus run refused in {seconds:.1f}s")


@pytest.mark.slow
def test_worker_trainer_refuses_a_model_that_cannot_fit_before_loading(
    settings: Settings, llama_7b: Path, tmp_path: Path
) -> None:
    args = ["--config", str(EXAMPLE / "rl.toml"), "--model", str(llama_7b)]
    started = time.monotonic()
    trainer = RoleProcess("trainer", settings, tmp_path / "logs", args)
    code = trainer.proc.wait(60)
    seconds = time.monotonic() - started
    said = refused("rlbus worker trainer", code, seconds, trainer.log_path.read_text())
    assert "the trainer would need ~" in said and "trainer.micro_batch_tokens = 8192" in said
    print(f"rlbus worker trainer refused in {seconds:.1f}s")


@pytest.mark.slow
def test_worker_inference_refuses_a_model_that_cannot_fit_before_loading(
    settings: Settings, too_large_to_serve: Path, tmp_path: Path
) -> None:
    args = ["--model", str(too_large_to_serve), "--port", str(free_port())]
    started = time.monotonic()
    inference = RoleProcess("inference", settings, tmp_path / "logs", args)
    code = inference.proc.wait(60)
    seconds = time.monotonic() - started
    said = refused("rlbus worker inference", code, seconds, inference.log_path.read_text())
    assert "inference would need ~" in said and "KV cache" in said
    print(f"rlbus worker inference refused in {seconds:.1f}s")


def command(pid: int) -> str:
    """A process's command line, for a failure to name which role it is."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[-120:]
    except OSError:
        return "gone"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_loading_rlbus_run_stops_with_every_role_within_10_s(
    smollm2_dir: Path, tmp_path: Path, how: str
) -> None:
    """SmolLM2-135M (fp32: 540 MB its trainer and its server each load) with every role
    starting at once: the signal comes as soon as the trainer and inference say what they are
    about to load. Ctrl-C reaches the terminal's whole process group; SIGTERM (systemd, a
    script's timeout) the launcher alone."""
    args = [*run_args(tmp_path, smollm2_dir), "--trainer.micro-batch-tokens", "1024"]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        start_new_session=True,  # a process group of its own, as a terminal gives a command
    )
    logs = tmp_path / "store" / "runs" / "cli" / "logs"
    roles: list[int] = []

    def running() -> None:
        if proc.poll() is not None:
            pytest.fail(f"rlbus run exited {proc.returncode}: {proc.communicate()[0][-3000:]}")

    try:
        wait_for(
            lambda: (
                said(logs / "trainer.log", "trainer: ")
                and said(logs / "inference.log", "inference ")
            ),
            180,
            "the trainer and inference to start loading",
            interval_s=0.05,
            check=running,
        )
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        roles = [int(pid) for pid in children if alive(int(pid))]
        signalled = time.monotonic()
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        roles_gone: float | None = None
        while proc.poll() is None or roles_gone is None:
            if roles_gone is None and not any(alive(pid) for pid in roles):
                roles_gone = time.monotonic() - signalled
            if time.monotonic() - signalled > STOPPED_WITHIN_S:
                left = [pid for pid in roles if alive(pid)]
                launcher = "still running" if proc.poll() is None else "gone"
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(
                    f"{left} of {roles} still running {STOPPED_WITHIN_S}s after {how} (the roles "
                    f"gone after {roles_gone}s, the launcher {launcher}): "
                    f"{proc.communicate()[0][-3000:]}"
                )
            time.sleep(0.05)
        seconds = time.monotonic() - signalled
        out = proc.communicate()[0]
        assert proc.returncode == 130 and "continue with --resume" in out, out[-3000:]
        trainer = (logs / "trainer.log").read_text()
        assert "trainer stopped while loading" in trainer, trainer[-3000:]
        print(
            f"{how}: the run and its {len(roles)} processes gone {seconds:.1f}s after it "
            f"(the roles after {roles_gone:.1f}s)"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in roles:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_worker_env_stops_at_once_while_loading_its_tokenizer(
    settings: Settings, smollm2_dir: Path, tmp_path: Path
) -> None:
    """A train-mode env producer loads its tokenizer (transformers, torch under it: seconds, many
    more under load) before it takes a task. SIGTERM meanwhile ends it then, not after the load:
    on the event loop the load held back the stop, and a run stopped while starting had its env
    killed at the launcher's grace (CI of f149be7: roles gone 9.4 s after SIGTERM)."""
    args = [str(EXAMPLE), "--mode", "train", "--tokenizer", str(smollm2_dir)]
    env = RoleProcess("env", settings, tmp_path / "logs", [*args, "--base-url", NOWHERE])
    try:
        wait_for(
            lambda: said(env.log_path, "env producer reverse_text"),
            120,
            "the env producer to say what it runs",
            interval_s=0.02,
            check=processes.alive(env),
        )
        signalled = time.monotonic()
        env.terminate()
        code = env.proc.wait(STOPPED_WITHIN_S)
        seconds = time.monotonic() - signalled
    finally:
        if env.alive():
            env.kill()
    log = env.log_path.read_text()
    assert code == 0 and "env producer stopped while loading its tokenizer" in log, log[-3000:]
    print(f"rlbus worker env stopped {seconds:.1f}s after SIGTERM, while loading its tokenizer")


def test_an_rlbus_process_skips_the_interpreters_last_collection(tmp_path: Path) -> None:
    """The last full collection of a process holding torch took 0.75 s (seconds under load) for
    each role and the launcher, and with it a stopped run took 4-5 s where it now takes 1-1.5 s.
    A cycle left to the end would be collected there (its __del__ says so); in a process that
    imported the rlbus command, it goes with the process."""
    script = (
        "import sys\n"
        "if sys.argv[1] == 'rlbus': import rlbus.cli\n"
        "class Cycle:\n"
        "    def __del__(self): print('collected at exit')\n"
        "cycle = Cycle(); cycle.me = cycle; del cycle\n"
    )
    said = {
        how: subprocess.run(
            [sys.executable, "-c", script, how], capture_output=True, text=True, check=True
        ).stdout
        for how in ("plain", "rlbus")
    }
    assert said == {"plain": "collected at exit\n", "rlbus": ""}, said
