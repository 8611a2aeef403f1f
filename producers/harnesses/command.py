"""`command`: any program, run in the rollout's sandbox with OPENAI_BASE_URL / ANTHROPIC_BASE_URL
(and API keys) pointing at the rollout's own interception URL. The program needs no rlbus code.
It finds the task in $RLBUS_TASK_FILE (JSON: task_id, prompt, messages, info) and the prompt's
last user text on stdin; its stdout is kept in state["stdout"], and its tree's CPU seconds and
peak MiB in state["program_cpu_s"] and state["program_peak_mb"] where the runtime measured them.
In `command`, {python} is this interpreter, {workdir} the rollout's directory and {env_dir} the
environment's own directory (a sandbox lets the program read that directory, and reach its own
URL only)."""

from __future__ import annotations

import json
import sys

from rlbus.config.env import HarnessConfig
from rlbus.producers.harnesses.base import HarnessError, Rollout
from rlbus.schemas import Messages
from rlbus.schemas.messages import text_of

TASK_FILE = "task.json"


class CommandHarness:
    def __init__(self, config: HarnessConfig):
        if not config.command:
            raise ValueError("the command harness needs harness.command (an argv list)")
        self.config = config

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
        argv = [
            arg.format(python=sys.executable, workdir=sandbox.workdir, env_dir=rollout.env.root)
            for arg in self.config.command
        ]
        env = {
            "OPENAI_BASE_URL": session.base_url,
            "OPENAI_API_KEY": "rlbus",
            "ANTHROPIC_BASE_URL": session.anthropic_base_url,
            "ANTHROPIC_API_KEY": "rlbus",
            "RLBUS_MODEL": session.server.backend.model,
            "RLBUS_TASK_FILE": str(task_file),
            **self.config.env,
        }
        user = next((m for m in reversed(rollout.prompt) if m.get("role") == "user"), {})
        result = await sandbox.run(
            argv,
            env,
            stdin=text_of(user.get("content")).encode(),
            readable=[rollout.env.root],
            endpoint=session,
        )
        rollout.state.update(stdout=result.stdout, exit_code=result.returncode)
        # The program tree's cost, where the runtime measured it (a cgroup): queryable per rollout.
        measured = {"program_cpu_s": result.cpu_s, "program_peak_mb": result.peak_mb}
        rollout.state.update({k: round(v, 3) for k, v in measured.items() if v is not None})
        if result.error_kind:
            raise HarnessError(result.error_kind, result.error)
        return session.trace.completion()
