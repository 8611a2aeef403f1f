"""An Orchestrator from a run config: environments loaded, algorithms chosen per environment,
a teacher client where an algorithm needs one."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from rlbus.bus import Bus
from rlbus.clients.replicas import Roster, StartingReplicas
from rlbus.config.orchestrator import EnvEntry
from rlbus.config.runs import RunConfig
from rlbus.consumers.orchestrator.algorithms import Context, make_algorithm
from rlbus.consumers.orchestrator.join import Joiner
from rlbus.consumers.orchestrator.orchestration import Orchestrator
from rlbus.consumers.orchestrator.pacing import pacing_for
from rlbus.consumers.orchestrator.task_draw import TaskSource, WeightedEnvironment
from rlbus.consumers.orchestrator.teacher_scoring import PatientTeacher, teacher_urls
from rlbus.environment import Environment, load_environment

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def env_spec(entry: EnvEntry, base_dir: Path) -> str:
    """What load_environment takes for a run config's environment: its path made relative to
    the config's directory where it is one, a module:Class spec as it is."""
    path = Path(entry.path) if Path(entry.path).is_absolute() else base_dir / entry.path
    return str(path) if path.exists() else entry.path


def load_envs(cfg: RunConfig, base_dir: Path) -> dict[str, Environment]:
    return {
        name: load_environment(env_spec(entry, base_dir), {**entry.overrides, "id": name})
        for name, entry in cfg.envs.items()
    }


def build_orchestrator(bus: Bus, cfg: RunConfig, base_dir: Path) -> Orchestrator:
    envs = load_envs(cfg, base_dir)

    @cache
    def tokenizer() -> PreTrainedTokenizerBase:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(cfg.model)

    def encode(text: str) -> list[int]:
        return tokenizer().encode(text, add_special_tokens=False)

    algorithms = {}
    urls = teacher_urls(cfg)
    for name, entry in cfg.envs.items():
        model = entry.algorithm.teacher_model or None
        teacher = PatientTeacher(urls[name], model) if name in urls else None
        ctx = Context(teacher=teacher, encode=encode)
        algorithms[name] = make_algorithm(entry.algorithm, ctx)
    o = cfg.orchestrator
    tasks = TaskSource(
        [WeightedEnvironment(envs[n], e.weight) for n, e in cfg.envs.items()],
        cfg.run_id,
        o.held_out_fraction,
        o.seed,
    )
    joiner = Joiner(cfg.run_id, set(envs), lambda env: envs[env].config.sampling.temperature or 1.0)
    pacing = pacing_for(o, cfg.max_steps)
    roster = Roster(cfg.kafka.announce_every_s)
    return Orchestrator(
        bus,
        o,
        cfg.run_id,
        cfg.max_steps,
        tasks,
        algorithms,
        joiner,
        pacing,
        roster,
        cfg.inference.served_by,
        StartingReplicas(cfg.inference.expected(), cfg.inference.start_wait_s),
    )
