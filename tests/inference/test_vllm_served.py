"""The inference role on a real vLLM (its CPU build, in the environment `rlbus engine install
vllm` makes): started the documented way (`rlbus worker inference --backend vllm`, which
re-executes itself there), it serves SmolLM2 with the exact ids and the fp32 trainer's
log-probs, loads a weight version published on the bus, and stops on SIGTERM.

Without that environment the test is skipped, except under CI (CI=true), where .ci/run makes it
and a missing one fails."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from rlbus.bus import Bus, free_port
from rlbus.bus.waiting import wait_until
from rlbus.config import Settings
from rlbus.consumers.inference.vllm_backend import CPU_ALLOCATOR_ENV, ENGINE_DEAD_EXIT
from rlbus.launch.engines import engine_dir, read_engine_record
from rlbus.launch.processes import RoleProcess
from rlbus.schemas import WeightVersion

# vLLM's start alone may take minutes on a loaded CPU (start_vllm waits up to 900 s).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = [1, 9690, 314, 253, 1761, 2767, 28, 33, 1345, 30, 198]
TOLERANCE = 1e-4
"""Per-token log-prob gap allowed against an fp32 forward of the same weights."""


@pytest.fixture(scope="module")
def engine_installed() -> None:
    if read_engine_record("vllm") is None:
        if os.environ.get("CI") == "true":
            pytest.fail(
                f"CI runs this against vLLM's environment, and {engine_dir('vllm')} has none"
            )
        pytest.skip("vLLM's environment is not installed here: `rlbus engine install vllm`")


def reference_logprobs(
    model: torch.nn.Module, prompt: list[int], completion: list[int]
) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    positions = range(len(prompt) - 1, len(prompt) + len(completion) - 1)
    return [float(logprobs[p, t]) for p, t in zip(positions, completion, strict=True)]


async def generate(client: httpx.AsyncClient, url: str) -> dict:
    body = {"prompt_ids": PROMPT, "sampling": {"max_tokens": 12, "temperature": 1.0, "seed": 3}}
    response = await client.post(f"{url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


async def start_vllm(settings: Settings, model: Path, logs: Path) -> tuple[RoleProcess, str]:
    """`rlbus worker inference --backend vllm`, once it serves (its /v1 URL)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    args = ["--model", str(model), "--port", str(port), "--backend", "vllm"]
    args += ["--inference.vllm.kv-cache-gib", "1", "--inference.vllm.max-model-len", "512"]
    server = RoleProcess("inference", settings, logs, args)
    async with httpx.AsyncClient() as client:
        for _ in range(900):  # vLLM loads, profiles and warms up first
            try:
                if (await client.get(f"{url}/models", timeout=5)).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.alive(), server.log_tail()
            await asyncio.sleep(1)
        else:
            raise AssertionError(f"vLLM did not serve in 900 s:\n{server.log_tail()}")
    assert "vLLM started" in server.log_tail(200), server.log_tail()
    return server, url


async def test_vllm_serves_exact_logprobs_and_reloads_a_version(
    engine_installed: None, settings: Settings, smollm2_dir: Path, tmp_path: Path
) -> None:
    server, url = await start_vllm(settings, smollm2_dir, tmp_path / "logs")
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    try:
        async with httpx.AsyncClient() as client:
            first = await generate(client, url)
            ids = first["completion_ids"]
            expected = reference_logprobs(model, PROMPT, ids)
            gaps = [abs(a - b) for a, b in zip(first["logprobs"], expected, strict=True)]
            assert max(gaps) < TOLERANCE, gaps
            assert first["policy_version"] == 0

            scored = await client.post(
                f"{url}/score", json={"prompt_ids": PROMPT, "completion_ids": ids}, timeout=120
            )
            assert scored.status_code == 200, scored.text
            score_gaps = [
                abs(a - b) for a, b in zip(scored.json()["logprobs"], expected, strict=True)
            ]
            assert max(score_gaps) < TOLERANCE, score_gaps

            # Version 1: every weight scaled, published on the bus as the trainer does.
            weights = tmp_path / "v000001"
            weights.mkdir()
            changed = {n: p.detach() * 1.05 for n, p in model.named_parameters()}
            save_file(changed, str(weights / "model.safetensors"))
            async with Bus.of(settings) as bus:
                await bus.publish(WeightVersion(version=1, step=1, uri=str(weights)))
            second: dict = {}

            async def reloaded() -> bool:
                nonlocal second
                second = await generate(client, url)
                return second["policy_version"] == 1

            for _ in range(120):
                if await reloaded():
                    break
                await asyncio.sleep(1)
            assert second["policy_version"] == 1, server.log_tail()
            with torch.no_grad():
                for name, param in model.named_parameters():
                    param.copy_(changed[name])
            expected = reference_logprobs(model, PROMPT, second["completion_ids"])
            gaps = [abs(a - b) for a, b in zip(second["logprobs"], expected, strict=True)]
            assert max(gaps) < TOLERANCE, gaps
    finally:
        server.proc.send_signal(signal.SIGTERM)
        await wait_until(lambda: not server.alive(), 120, "vLLM's inference role to stop")
    assert server.proc.returncode == 0, server.log_tail()


def engine_core_of(pid: int) -> int:
    """The pid of vLLM's engine process among `pid`'s children."""
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        if "EngineCore" in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
            return int(child)
    raise AssertionError(f"no vLLM engine process under {pid}")


async def test_a_dead_engine_process_ends_the_role_with_a_reason(
    engine_installed: None, settings: Settings, smollm2_dir: Path, tmp_path: Path
) -> None:
    """Killed (or OOM-killed), vLLM's engine process would leave a server answering 500s: the
    role exits instead, with its own code and a line saying why, for its launcher to report."""
    server, _ = await start_vllm(settings, smollm2_dir, tmp_path / "logs")
    try:
        os.kill(engine_core_of(server.proc.pid), signal.SIGKILL)
        await wait_until(lambda: not server.alive(), 60, "the role to exit")
    finally:
        if server.alive():
            server.proc.kill()
    assert server.proc.returncode == ENGINE_DEAD_EXIT, server.log_tail()
    assert "vLLM's engine process died" in server.log_tail(100)


async def test_a_killed_role_takes_vllms_engine_processes_with_it(
    engine_installed: None, settings: Settings, smollm2_dir: Path, tmp_path: Path
) -> None:
    """SIGKILLed alone, the role left vLLM's engine processes running, holding their GBs (found
    by bench/faults.py --backend vllm): its launcher's kill takes the whole tree."""
    server, _ = await start_vllm(settings, smollm2_dir, tmp_path / "logs")
    engine = engine_core_of(server.proc.pid)
    # The allocator settings that spare a weight update its page faults reach vLLM's processes.
    environ = Path(f"/proc/{engine}/environ").read_bytes().decode().split("\0")
    assert {f"{k}={v}" for k, v in CPU_ALLOCATOR_ENV.items()} <= set(environ)
    server.kill()
    await wait_until(lambda: not Path(f"/proc/{engine}").exists(), 30, "the engine process to go")
