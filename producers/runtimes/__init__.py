"""Runtimes: where a rollout's programs run (sandbox, subprocess, local, docker; auto picks)."""

from rlbus.config.env import RuntimeConfig
from rlbus.environment.docker_engine import docker_problem
from rlbus.producers.runtimes.base import (
    ExecResult,
    Mount,
    ProcessRuntime,
    RolloutEndpoint,
    Runtime,
    Sandbox,
    run_process,
)
from rlbus.producers.runtimes.docker import DockerRuntime
from rlbus.producers.runtimes.local import LocalRuntime, SubprocessRuntime
from rlbus.producers.runtimes.sandbox import AutoRuntime, SandboxRuntime, sandbox_problem

RUNTIMES: dict[str, type[ProcessRuntime]] = {
    "auto": AutoRuntime,
    "local": LocalRuntime,
    "subprocess": SubprocessRuntime,
    "sandbox": SandboxRuntime,
    "docker": DockerRuntime,
}


def make_runtime(config: RuntimeConfig) -> Runtime:
    return RUNTIMES[config.kind](config)


__all__ = [
    "AutoRuntime",
    "DockerRuntime",
    "RolloutEndpoint",
    "ExecResult",
    "LocalRuntime",
    "Mount",
    "ProcessRuntime",
    "Runtime",
    "Sandbox",
    "SandboxRuntime",
    "SubprocessRuntime",
    "docker_problem",
    "make_runtime",
    "run_process",
    "sandbox_problem",
]
