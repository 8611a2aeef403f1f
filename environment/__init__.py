"""The environment contract, below every role: a task set (data + rules), tagged
rewards/metrics/tools, LLM judges, its run configuration (harness, runtime, group size,
sampling) from TOML, the scorer that runs its rewards (the judge, `rlbus eval` and
`rlbus rescore` share it), the task sources it draws from, and the algorithm hook (how a
scored group becomes per-token advantages). Env producers and consumers both import it; it
imports no role."""

from rlbus.config.env import (
    EnvConfig,
    HarnessConfig,
    McpServerConfig,
    ModelConfig,
    RuntimeConfig,
    SamplingConfig,
    UserModelConfig,
)
from rlbus.environment.algorithm import Algorithm, Context, GroupMember, algorithm
from rlbus.environment.decorators import group_reward, metric, reward, tool, user
from rlbus.environment.judges import LLMJudge, ReferenceJudge, RubricJudge
from rlbus.environment.loader import Environment, load_environment, resolve_taskset
from rlbus.environment.rules import Rule, RuleError, Rules, discover
from rlbus.environment.scoring import Scorer, rollout_arguments
from rlbus.environment.taskset import TaskSet

__all__ = [
    "Algorithm",
    "Context",
    "GroupMember",
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
    "algorithm",
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
