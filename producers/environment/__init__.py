"""Environment definition: a task set (data + rules), tagged rewards/metrics/tools, LLM judges,
its run configuration (harness, runtime, group size, sampling) from TOML, and the scorer that
runs its rewards (the judge, `rlbus eval` and `rlbus rescore` share it)."""

from rlbus.config.env import (
    EnvConfig,
    HarnessConfig,
    McpServerConfig,
    ModelConfig,
    RuntimeConfig,
    SamplingConfig,
    UserModelConfig,
)
from rlbus.producers.environment.decorators import group_reward, metric, reward, tool, user
from rlbus.producers.environment.judges import LLMJudge, ReferenceJudge, RubricJudge
from rlbus.producers.environment.loader import Environment, load_environment, resolve_taskset
from rlbus.producers.environment.rules import Rule, RuleError, Rules, discover
from rlbus.producers.environment.scoring import Scorer, rollout_arguments
from rlbus.producers.environment.taskset import TaskSet

__all__ = [
    "EnvConfig",
    "Environment",
    "HarnessConfig",
    "LLMJudge",
    "McpServerConfig",
    "ModelConfig",
    "ReferenceJudge",
    "RubricJudge",
    "Rule",
    "RuleError",
    "Rules",
    "RuntimeConfig",
    "SamplingConfig",
    "Scorer",
    "TaskSet",
    "UserModelConfig",
    "discover",
    "group_reward",
    "load_environment",
    "metric",
    "resolve_taskset",
    "rollout_arguments",
    "reward",
    "tool",
    "user",
]
