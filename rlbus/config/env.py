"""Environment configuration: pydantic models read from TOML (`[env]` tables) and CLI overrides.

The task set names rules and data; this says how it is run: harness, runtime, group size,
sampling and the model endpoint. Every field's docstring is its help text.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rlbus.config.base import Section


class SamplingConfig(Section):
    """Set fields override what the harness asks for, so the run controls sampling."""

    temperature: float | None = Field(default=None, ge=0)
    """Sampling temperature for every model call; unset: the harness's value."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling mass; unset: the harness's value."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most tokens per model call; unset: the harness's value."""
    stop: list[str] | None = None
    """Stop strings for every model call; unset: the harness's value."""
    seed: int | None = None
    """Sampling seed sent with every model call."""
    logprobs: bool = False
    """Eval mode: also ask the upstream for log-probs (train mode always records them)."""


class ModelConfig(Section):
    name: str = "default"
    """Model name sent upstream and recorded on every rollout."""
    base_url: str | None = None
    """Eval: any OpenAI-compatible /v1 URL. Train: the inference server's URL (POST
    /v1/generate)."""
    replica_urls: list[str] = []
    """Train: more inference servers' /v1 URLs besides base_url. Each rollout goes to one of
    them (all its turns), the one with the fewest requests outstanding among those serving the
    version its task asks for; a call is made again on another when its replica dies. Replicas
    that announce themselves on the run's bus join without being listed here."""
    mode: Literal["eval", "train"] = "eval"
    """eval: chat with any OpenAI-compatible upstream; train: token-in/token-out with exact ids."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the upstream API key (eval mode)."""
    tokenizer: str | None = None
    """Train mode: model directory or hub id whose tokenizer and chat template render prompts."""
    renderer: str | None = None
    """Train mode: a `renderers` renderer name, "template", or unset to choose by model."""
    timeout_s: float = Field(default=600, gt=0)
    """Timeout of one upstream call."""


class UserModelConfig(Section):
    """A model playing the user (model-driven user simulator)."""

    name: str
    """Model name of the simulator."""
    base_url: str
    """OpenAI-compatible /v1 URL of the simulator."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding its API key."""
    instructions: str = (
        "You are the user. Reply with your next message only; reply DONE when satisfied."
    )
    """System prompt of the simulator; the task's info["user"] is appended when present."""
    done: str = "DONE"
    """A reply equal to this ends the rollout."""


class McpServerConfig(Section):
    command: list[str]
    """argv of an MCP server speaking stdio; its tools join the task set's tools."""
    env: dict[str, str] = {}
    """Environment for the server process."""


class HarnessConfig(Section):
    kind: Literal["single", "tools", "command", "llm", "openai-agents", "mini-swe-agent"] = "single"
    """single: one chat turn; tools: tool-calling loop; command: run a program against the
    rollout's URL; llm, openai-agents, mini-swe-agent: that agent (installed from PyPI) as a
    command, with a state directory per rollout."""
    max_turns: int = Field(default=10, ge=1)
    """Most model calls per rollout (tools harness, user simulators, and the openai-agents and
    mini-swe-agent presets)."""
    command: list[str] = []
    """command harness: argv; {python} is this interpreter, {workdir} the rollout's directory,
    {env_dir} the environment's directory, {state} the rollout's state directory."""
    env: dict[str, str] = {}
    """command harness and agent presets: extra environment variables for the program
    ({workdir}, {env_dir} and {state}, the rollout's state directory, are filled in)."""
    args: list[str] = []
    """Agent presets: extra arguments for the agent's command line (e.g. llm's
    ["-o", "temperature", "0.2"], mini-swe-agent's ["-c", "agent.step_limit=5"])."""
    api: Literal["responses", "chat"] = "responses"
    """openai-agents: the OpenAI API the Agents SDK speaks (Responses or chat completions)."""
    mcp_servers: list[McpServerConfig] = []
    """tools harness: MCP servers whose tools the model may call."""
    user_model: UserModelConfig | None = None
    """A model-driven user simulator; without it a task set's @user method (if any) plays the
    user."""
    timeout_s: float = Field(default=600, gt=0)
    """Whole-rollout time limit; a rollout over it is recorded as errored (kind "timeout")."""
    max_request_mb: int = Field(default=32, ge=1)
    """Largest request body a rollout may send to its interception URL, MiB (a larger one: 413)."""


class RuntimeConfig(Section):
    kind: Literal["auto", "local", "subprocess", "sandbox", "docker"] = "auto"
    """Where programs run. sandbox: bubblewrap (own PID, mount and network namespaces; reaches only
    its own interception URL); subprocess: unsandboxed child with an allow-listed environment, its
    tree bounded and killed; local: plain child process (this process's environment, time limit
    only); docker: a container per run; auto: sandbox where bubblewrap works, else subprocess."""
    timeout_s: float = Field(default=300, gt=0)
    """Wall-clock limit of one program run; its whole process tree is killed when it is over."""
    memory_mb: int | None = Field(default=None, ge=16)
    """Memory of the program's whole process tree (a cgroup where this host lets us make one, else
    an address-space limit per process plus a watchdog on the tree's RSS; docker --memory)."""
    cpu_s: int | None = Field(default=None, ge=1)
    """CPU-seconds limit of each process (RLIMIT_CPU; docker --ulimit cpu)."""
    cpus: float | None = Field(default=None, gt=0)
    """CPUs the program's tree may use at once (cgroup CPU quota where writable; docker --cpus)."""
    pids_max: int | None = Field(default=1024, ge=1)
    """Most processes and threads in the program's tree (cgroup pids controller where writable;
    docker --pids-limit)."""
    keep_env: list[str] = ["PATH", "LANG", "LC_ALL", "TZ"]
    """subprocess, sandbox, docker: the only variables kept from this process's environment."""
    read_only: list[str] = []
    """sandbox: more host paths the program may read (the system's, this interpreter's and the
    environment's own directories are always there)."""
    image: str = "python:3.11-slim"
    """docker: image the program runs in."""
    docker_args: list[str] = []
    """docker: extra arguments to `docker run`."""
    keep_workdir: bool = False
    """Keep each rollout's working directory after it finished (debugging)."""


class EnvConfig(Section):
    taskset: str
    """The task set: an entry point in group "rlbus.environments", package.module:Class or
    FILE.py:Class."""
    id: str | None = None
    """Environment id on tasks and rollouts; unset: the task set's name."""
    args: dict[str, Any] = {}
    """Keyword arguments for the task set's constructor."""
    group_size: int = Field(default=1, ge=1)
    """Rollouts per task (a task's own group_size wins when set)."""
    max_concurrent_rollouts: int = Field(default=64, ge=1)
    """Rollouts in flight at once in one env producer."""
    reward_timeout_s: float = Field(default=60, gt=0)
    """A reward, metric or group reward running longer marks its rollouts errored."""
    group_wait_s: float = Field(default=900, gt=0)
    """With group rewards, a group still missing rollouts this long after its first arrived is
    scored as errors (counted), so it never holds back the judge's commits."""
    max_group_size: int = Field(default=256, ge=1)
    """Largest group_size a task may ask for; a larger one is dead-lettered, naming both."""
    harness: HarnessConfig = HarnessConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    sampling: SamplingConfig = SamplingConfig()
    model: ModelConfig = ModelConfig()


def cli_overrides(
    model: str | None,
    base_url: str | None,
    group_size: int | None = None,
    concurrency: int | None = None,
    harness: str | None = None,
    runtime: str | None = None,
    mode: str | None = None,
    tokenizer: str | None = None,
) -> dict[str, Any]:
    """EnvConfig overrides from a command line (unset options leave the TOML's values)."""
    model_cfg = {
        k: v
        for k, v in {
            "name": model,
            "base_url": base_url,
            "mode": mode,
            "tokenizer": tokenizer,
        }.items()
        if v is not None
    }
    out: dict[str, Any] = {"model": model_cfg}
    if group_size is not None:
        out["group_size"] = group_size
    if concurrency is not None:
        out["max_concurrent_rollouts"] = concurrency
    if harness is not None:
        out["harness"] = {"kind": harness}
    if runtime is not None:
        out["runtime"] = {"kind": runtime}
    return out
