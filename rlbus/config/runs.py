"""Configs of whole runs: `rlbus run` (every role's settings in one TOML file) and
`rlbus replay sft`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from rlbus.config.base import ConfigError, Section
from rlbus.config.loading import load_settings
from rlbus.config.orchestrator import EnvEntry, OrchestratorConfig
from rlbus.config.settings import Settings, data_dir
from rlbus.config.trainer import OptimConfig, TrainerConfig


class VLLMConfig(Section):
    """Engine settings of the vLLM backend (`inference.backend = "vllm"`). The defaults start on
    the machine it runs on: fp32 on a CPU (log-probs then match an fp32 trainer's), a KV cache
    sized from the memory free when it starts, eager mode on a CPU (compiling costs minutes of
    start-up there)."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and activations; auto: float32 on a CPU, bfloat16 on a GPU. vLLM's own default
    serves bf16 even from an fp32 checkpoint, off the fp32 trainer's log-probs by ~1e-2."""
    kv_cache_gib: int = Field(default=0, ge=0)
    """KV-cache memory on a CPU (vLLM's VLLM_CPU_KVCACHE_SPACE); 0: a quarter of the memory
    available at start, at most 8 GiB. (vLLM's CPU worker asks for 92 % of the machine
    otherwise, and refuses to start when other processes hold memory.)"""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Share of the GPU's memory vLLM may use (weights, activations, KV cache) on CUDA."""
    max_model_len: int = Field(default=0, ge=0)
    """Longest prompt + completion; 0: the model's, at most 4096 on a CPU (the KV cache is sized
    for it)."""
    eager: bool | None = None
    """Run without compiling or capturing graphs; unset: eager on a CPU, compiled on a GPU."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """GPUs one server shards the model over."""


class HFEngineConfig(Section):
    """Settings of the built-in engine (`inference.backend = "hf"`)."""

    decode: Literal["auto", "dynamic", "static"] = "auto"
    """How running sequences decode: dynamic, in one padded batch whose KV cache grows with
    them; static, in the slots of a KV cache allocated once, each step replaying a CUDA graph
    captured at start on a GPU; auto: static on a GPU, dynamic on a CPU (where a step costs its
    arithmetic, not its kernel launches)."""
    cache_length: int = Field(default=0, ge=0)
    """Positions per slot of the static cache, which bounds prompt + completion; 0: the model's
    context, or as many as half the device's free memory holds for 256 slots."""


class InferenceConfig(Section):
    url: str = ""
    """/v1 URL of a running inference server that follows this run's weights; empty (and no
    urls): `rlbus run` starts `replicas` of them."""
    urls: list[str] = []
    """More running inference servers of this run (/v1 URLs): env producers spread rollouts
    over them and url. Servers that announce themselves on the run's bus join by themselves."""
    replicas: int = Field(default=1, ge=1)
    """Inference servers `rlbus run` starts (when url and urls are empty)."""
    served_by: int = Field(default=0, ge=0)
    """Replicas that must serve a weights version before the orchestrator counts it as served
    (sync mode's next step, async mode's staleness bound, evaluations); 0: every live replica.
    A replica is live while it re-announces itself (every kafka.announce_every_s); with fewer
    live than this, every live one."""
    start_wait_s: float = Field(default=120.0, ge=0)
    """How long a new run's first tasks wait, once one replica serves the initial weights, for
    the run's others (url and urls, or the `replicas` it starts) to serve them too; then it
    starts with those live, and the others join when they announce themselves. (A resumed run
    starts with the replicas live.)"""
    backend: Literal["hf", "vllm"] = "hf"
    """Engine of the inference servers `rlbus run` starts."""
    device: str = "cpu"
    """Device of those servers."""
    port: int = Field(default=0, ge=0)
    """Port of the first of them (the others take the next ones); 0: free ones."""
    threads: int = Field(default=1, ge=1)
    """torch intra-op threads of each (1 suits tiny models on a small machine)."""
    python: str = ""
    """Interpreter the servers run under, for an engine whose pins cannot share rlbus's
    environment (vLLM's transformers is older than the trainer's); empty: for backend vllm the
    environment `rlbus engine install vllm` made, else this one."""
    vllm: VLLMConfig = VLLMConfig()
    hf: HFEngineConfig = HFEngineConfig()

    def given(self) -> list[str]:
        """The running servers configured (url first); empty: `rlbus run` starts its own."""
        return [u for u in (self.url, *self.urls) if u]

    def expected(self) -> int:
        """How many servers the run has from its start: those configured, or the `replicas`
        `rlbus run` starts. The larger of the two, as `rlbus run` gives its orchestrator the
        first replica's URL (the policy's server) beside the run's `replicas`."""
        return max(len(self.given()), self.replicas)


class HealthConfig(Section):
    """What `rlbus run` records of its own processes while it runs (rlbus.launch.run_health),
    for `rlbus ui` and `rlbus report`: memory and consumer lag over time, and incidents."""

    sample_every_s: float = Field(default=15.0, ge=0)
    """Seconds between samples of each process's resident memory and each consumer group's lag
    (one HealthSample event each time, a few hundred bytes); 0: none. Incidents (a role exited,
    the broker rotated) are recorded either way."""


class InferenceSettings(Settings):
    """`rlbus worker inference`'s settings: the shared ones and the [inference] table (its
    interpreter and vLLM's engine settings; the command's options give the rest)."""

    inference: InferenceConfig = InferenceConfig()


class RunConfig(Settings):
    """A training run: the settings of every role, in one TOML file."""

    model: str = ""
    """Hugging Face model directory the policy starts from (e.g. from `rlbus model init`)."""
    max_steps: int = Field(default=20, ge=1)
    """Optimizer steps of the run; the LR schedule ends here."""
    orchestrator: OrchestratorConfig = OrchestratorConfig()
    trainer: TrainerConfig = TrainerConfig()
    inference: InferenceConfig = InferenceConfig()
    sinks: int = Field(default=1, ge=1)
    """Sink processes `rlbus run` starts. On a ClickHouse server (store.url http(s)://...) they
    share the topics' partitions; a chdb store admits one process, so one holds it and the
    others wait as standbys, one of which takes it over if the holder dies."""
    envs: dict[str, EnvEntry] = {}
    """Environments by name: [envs.NAME] path = "...", algorithm.name = "grpo", overrides..."""
    health: HealthConfig = HealthConfig()

    def check(self) -> RunConfig:
        """What the model cannot check field by field (load_settings builds it empty first)."""
        if not self.model:
            raise ConfigError(
                "model is not set: give a model directory (rlbus model init PATH makes one)"
            )
        if not self.envs:
            raise ConfigError('no environments: add an [envs.NAME] table with path = "env.toml"')
        lora = self.trainer.lora
        if self.inference.backend == "vllm" and lora.enabled and lora.publish == "adapter":
            raise ConfigError(
                'trainer.lora.publish = "adapter" with inference.backend = "vllm": the vLLM '
                'backend loads full weights only; set trainer.lora.publish = "merged" (or use '
                'inference.backend = "hf", which applies the adapters itself)'
            )
        return self

    def base(self) -> Settings:
        """The shared settings alone, for roles that take no run config (sink, env, judge,
        inference)."""
        return Settings.model_validate(self.model_dump(include=set(Settings.model_fields)))

    def checkpoint_url(self) -> str:
        return self.trainer.checkpoint_url or str(data_dir(self) / "checkpoints" / self.run_id)


class ReplayConfig(Settings):
    """`rlbus replay sft` settings: the trainer table plus how long to train."""

    trainer: TrainerConfig = TrainerConfig(optim=OptimConfig(lr=2e-5))
    """The trainer; its lr defaults to 2e-5 here, a fine-tuning rate for a pretrained model (the
    trainer's 3e-4 made SmolLM2-135M diverge: docs/benchmarks.md has the losses)."""
    batch_size: int = Field(default=64, ge=1)
    """Samples per optimizer step."""
    steps: int = Field(default=100, ge=1)
    """Optimizer steps (samples are reshuffled each pass over them)."""
    seed: int = 0
    """Seed of the sample order."""


def load_run_config(path: Path | None, overrides: list[str]) -> RunConfig:
    """A run config from its TOML file and overrides, checked whole. A run needs a stable id to
    be resumed: unless one is given, it is the config file's name."""
    cfg = load_settings(path, overrides, model=RunConfig).check()
    if cfg.run_id == "default" and path is not None:
        cfg = cfg.model_copy(update={"run_id": path.stem})
    return cfg
