"""Harnesses: how the model acts in a rollout (single chat turn, tool loop, any program)."""

from rlbus.environment.hosted.venv_taskset import HostedTaskSet
from rlbus.environment.loader import Environment
from rlbus.producers.harnesses.base import Harness, HarnessError, Rollout
from rlbus.producers.harnesses.chat_loop import ChatHarness
from rlbus.producers.harnesses.command import CommandHarness
from rlbus.producers.harnesses.hosted import HostedHarness
from rlbus.producers.harnesses.presets import PRESETS
from rlbus.producers.harnesses.tools import ToolBox, open_toolbox, python_tool
from rlbus.producers.harnesses.users import ModelUser, ScriptedUser, UserSimulator


def make_harness(env: Environment) -> Harness:
    config = env.config.harness
    if isinstance(env.taskset, HostedTaskSet):
        return HostedHarness(env.taskset, config)
    if config.kind == "command":
        return CommandHarness(config)
    if config.kind in PRESETS:
        return CommandHarness(config, PRESETS[config.kind])
    user: UserSimulator | None = None
    if config.user_model is not None:
        user = ModelUser(config.user_model)
    elif env.rules.user is not None:
        user = ScriptedUser(env.rules.user)
    return ChatHarness(config, user)


__all__ = [
    "ChatHarness",
    "CommandHarness",
    "Harness",
    "HarnessError",
    "HostedHarness",
    "ModelUser",
    "Rollout",
    "ScriptedUser",
    "ToolBox",
    "UserSimulator",
    "make_harness",
    "open_toolbox",
    "python_tool",
]
