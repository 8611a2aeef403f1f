"""Runtimes: where a rollout's programs run (local, subprocess with limits, docker)."""

from rlbus.config.env import RuntimeConfig
from rlbus.producers.runtimes.base import ExecResult, Runtime, Sandbox, run_process
from rlbus.producers.runtimes.docker import DockerRuntime, docker_problem
from rlbus.producers.runtimes.local import LocalRuntime, SubprocessRuntime


def make_runtime(config: RuntimeConfig) -> Runtime:
    return {"local": LocalRuntime, "subprocess": SubprocessRuntime, "docker": DockerRuntime}[
        config.kind
    ](config)


__all__ = [
    "DockerRuntime",
    "ExecResult",
    "LocalRuntime",
    "Runtime",
    "Sandbox",
    "SubprocessRuntime",
    "docker_problem",
    "make_runtime",
    "run_process",
]
