"""Environment definition: a task set (data + rules), tagged rewards/metrics/tools, and its
run configuration (harness, runtime, group size, sampling) from TOML."""

from rlbus.producers.env.config import (
    EnvConfig,
    HarnessConfig,
    McpServerConfig,
    ModelConfig,
    RuntimeConfig,
    SamplingConfig,
    UserModelConfig,
)
from rlbus.producers.env.decorators import group_reward, metric, reward, tool, user
from rlbus.producers.env.loader import Environment, load_environment, resolve_taskset
from rlbus.producers.env.rules import Rule, RuleError, Rules, discover
from rlbus.producers.env.taskset import TaskSet

__all__ = [
    "EnvConfig",
    "Environment",
    "HarnessConfig",
    "McpServerConfig",
    "ModelConfig",
    "Rule",
    "RuleError",
    "Rules",
    "RuntimeConfig",
    "SamplingConfig",
    "TaskSet",
    "UserModelConfig",
    "discover",
    "group_reward",
    "load_environment",
    "metric",
    "resolve_taskset",
    "reward",
    "tool",
    "user",
]
