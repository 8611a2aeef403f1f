"""`command`: any program, run in the rollout's sandbox with OPENAI_BASE_URL / ANTHROPIC_BASE_URL
(and API keys) pointing at the rollout's own interception URL. The program needs no rlbus code.
It finds the task in $RLBUS_TASK_FILE (JSON: task_id, prompt, messages, info) and the prompt's
last user text on stdin; its stdout is kept in state["stdout"], and its tree's CPU seconds and
peak MiB in state["program_cpu_s"] and state["program_peak_mb"] where the runtime measured them.
In `command` and `env`, {python} is this interpreter, {workdir} the rollout's directory, {env_dir}
the environment's own directory (a sandbox lets the program read that directory, and reach its
own URL only) and {state} the rollout's state directory ($RLBUS_STATE_DIR). A known agent
(harnesses.presets) builds its own argv and settings instead of `command`."""

from __future__ import annotations

import json
import sys

from rlbus.config.env import HarnessConfig
from rlbus.producers.harnesses.base import HarnessError, Rollout
from rlbus.producers.harnesses.presets import Launch, Preset, Start
from rlbus.schemas import Messages
from rlbus.schemas.chat import text_of

TASK_FILE = "task.json"
STATE_DIR = ".state"
"""The rollout's state directory, under its working directory: an agent's logs, caches and
config live there, never shared with another rollout."""


class CommandHarness:
    def __init__(self, config: HarnessConfig, preset: Preset | None = None):
        if preset is not None:
            preset.check(config.kind)
        elif not config.command:
            raise ValueError("the command harness needs harness.command (an argv list)")
        self.config = config
        self.preset = preset

    async def run(self, rollout: Rollout) -> Messages:
        sandbox, session, task = rollout.sandbox, rollout.session, rollout.task
        task_file = sandbox.workdir / TASK_FILE
        task_file.write_text(
            json.dumps(
                {
                    "task_id": task.task_id,
                    "prompt": task.prompt,
                    "messages": rollout.prompt,
                    "info": task.info,
                }
            )
        )
        state = sandbox.workdir / STATE_DIR
        state.mkdir(exist_ok=True)
        fields = {
            "python": sys.executable,
            "workdir": sandbox.workdir,
            "env_dir": rollout.env.root,
            "state": state,
        }
        model = session.server.backend.model
        if self.preset is not None:
            launch = self.preset.launch(
                Start(rollout.prompt, state, session.base_url, model, self.config)
            )
        else:
            launch = Launch([arg.format(**fields) for arg in self.config.command])
        env = {
            "OPENAI_BASE_URL": session.base_url,
            "OPENAI_API_KEY": "rlbus",
            "ANTHROPIC_BASE_URL": session.anthropic_base_url,
            "ANTHROPIC_API_KEY": "rlbus",
            "RLBUS_MODEL": model,
            "RLBUS_TASK_FILE": str(task_file),
            "RLBUS_STATE_DIR": str(state),
            **launch.env,
            **{name: _fill(value, fields) for name, value in self.config.env.items()},
        }
        user = next((m for m in reversed(rollout.prompt) if m.get("role") == "user"), {})
        result = await sandbox.run(
            launch.argv,
            env,
            stdin=text_of(user.get("content")).encode(),
            readable=[rollout.env.root, *launch.readable],
            endpoint=session,
        )
        rollout.state.update(stdout=result.stdout, exit_code=result.returncode)
        # The program tree's cost, where the runtime measured it (a cgroup): queryable per rollout.
        measured = {"program_cpu_s": result.cpu_s, "program_peak_mb": result.peak_mb}
        rollout.state.update({k: round(v, 3) for k, v in measured.items() if v is not None})
        if result.error_kind:
            raise HarnessError(result.error_kind, result.error)
        return session.trace.completion()


def _fill(value: str, fields: dict[str, object]) -> str:
    """`value` with {python}, {workdir}, {env_dir} and {state} filled in; any other braces (a
    JSON value) stay as they are."""
    for name, filled in fields.items():
        value = value.replace("{" + name + "}", str(filled))
    return value
