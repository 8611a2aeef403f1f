"""Distillation teachers named by a stored version (`[envs.NAME.algorithm] teacher =
"run:RUN_ID@VERSION"`), made ready before `rlbus run` starts anything.

A teacher is a weight version a past run announced on `weights` and the sink kept in
`weight_versions`: it is found in this run's store and served by an inference replica that
follows no run's weights. A LoRA version (adapters alone, over `teacher_base`, default this
run's model) has its weights file copied under the run's directory and is served as an adapter:
every LoRA teacher of one base on one built-in engine, one copy of the base, each chosen per
score request by its name (served_adapters.py). A full version, or any version when the run's
inference backend is not the built-in one, is written out as a model directory (the way `rlbus
model export` writes one) and served alone. `@latest` is pinned to the newest stored version
when the run starts. A teacher that is not in the store, whose weights file is gone, that does
not fit its base, or whose tokenizer is not the student's (its log-probs would score other
tokens) refuses the run, naming the environment and the teacher. Environments that name the
same version share it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlbus.config.runs import RunConfig
from rlbus.config.version_ref import VersionRef
from rlbus.launch.model_export import ModelExportError, export_version
from rlbus.schemas.weights_file import FORMATS

EXPORTED = ".rlbus-teacher.json"
"""In a teacher's directory: the stored version it was written from (a resumed run reuses it)."""


class TeacherError(Exception):
    """A teacher the run cannot use; the message names the environment, the teacher and why."""


@dataclass(frozen=True)
class Teacher:
    ref: VersionRef
    """The version, pinned (`@latest` resolved)."""
    model_dir: Path
    """Its model directory: the version written out, or the base its adapter is served on."""
    envs: tuple[str, ...]
    """The environments it teaches."""
    adapter: Path | None = None
    """A LoRA version's weights file, served as an adapter over `model_dir`."""

    @property
    def name(self) -> str:
        return f"teacher-{self.ref.run_id}-v{self.ref.version}"


@dataclass(frozen=True)
class TeacherServer:
    """One inference server of a run's teachers: a written-out teacher alone, or every LoRA
    teacher of one base, as adapters named after the teachers."""

    name: str
    model_dir: Path
    teachers: tuple[Teacher, ...]

    @property
    def adapters(self) -> dict[str, Path]:
        return {t.name: t.adapter for t in self.teachers if t.adapter is not None}


def teacher_servers(teachers: list[Teacher]) -> list[TeacherServer]:
    """The servers `teachers` need: one per written-out teacher, one per base of adapters."""
    servers = [TeacherServer(t.name, t.model_dir, (t,)) for t in teachers if t.adapter is None]
    by_base: dict[Path, list[Teacher]] = {}
    for teacher in teachers:
        if teacher.adapter is not None:
            by_base.setdefault(teacher.model_dir, []).append(teacher)
    for base, adapters in by_base.items():
        name = "teacher-adapters" if len(by_base) == 1 else f"teacher-adapters-{base.name}"
        servers.append(TeacherServer(name, base, tuple(adapters)))
    return servers


def model_dir(path: str) -> Path:
    """A model directory as `rlbus run` resolves its `model`: from where it was started."""
    return Path(path).expanduser().resolve()


def check_same_tokenizer(student: Path, base: Path, where: str) -> None:
    """The teacher scores the student's token ids: both must mean the same text by them."""
    if student.resolve() == base.resolve():
        return
    from transformers import AutoTokenizer

    mine = AutoTokenizer.from_pretrained(student).get_vocab()
    theirs = AutoTokenizer.from_pretrained(base).get_vocab()
    if mine != theirs:
        differ = sum(theirs.get(token) != i for token, i in mine.items())
        raise TeacherError(
            f"{where}: its tokenizer ({base}) is not the student's ({student}): "
            f"{len(theirs):,} tokens against {len(mine):,}, {differ:,} of the student's with "
            "another id or none; a teacher must share the student's tokenizer"
        )


def named_teachers(cfg: RunConfig) -> dict[tuple[str, Path], list[str]]:
    """The environments of each (stored-version teacher, its base) that `cfg` names."""
    found: dict[tuple[str, Path], list[str]] = {}
    for env, entry in cfg.envs.items():
        algorithm = entry.algorithm
        if algorithm.teacher:
            key = (algorithm.teacher, model_dir(algorithm.teacher_base or cfg.model))
            found.setdefault(key, []).append(env)
    return found


def servers_needed(cfg: RunConfig) -> int:
    """How many servers the run's stored-version teachers will need (teacher_servers), from
    the store's record of each version's format alone, no weights read: what the memory check
    counts. A version the store does not hold counts one (prepare_teachers refuses it)."""
    from rlbus.bus.store import StoreError, open_store
    from rlbus.launch.model_export import find_version

    found = named_teachers(cfg)
    if not found or cfg.inference.backend != "hf":
        return len(found)
    alone, bases = 0, set()
    try:
        with open_store(cfg.store.url, read_only=True) as store:
            for text, base in found:
                try:
                    version, _ = find_version(store, VersionRef.parse(text), cfg.store.url)
                except ModelExportError:
                    alone += 1
                    continue
                if version.format == FORMATS["lora-delta"]:
                    bases.add(base)
                else:
                    alone += 1
    except StoreError:
        return len(found)
    return alone + len(bases)


def prepare_teachers(cfg: RunConfig, run_dir: Path) -> list[Teacher]:
    """Every stored-version teacher of `cfg`'s environments, ready to serve (ready_teacher),
    or TeacherError for the first that cannot be."""
    student = model_dir(cfg.model)
    teachers: list[Teacher] = []
    for (text, base), envs in named_teachers(cfg).items():
        where = f"envs.{envs[0]}.algorithm.teacher = {text!r}"
        try:
            check_same_tokenizer(student, base, where)
            teachers.append(ready_teacher(cfg, VersionRef.parse(text), base, run_dir, envs))
        except ModelExportError as exc:
            raise TeacherError(f"{where}: {exc}") from None
    return teachers


def ready_teacher(
    cfg: RunConfig, ref: VersionRef, base: Path, run_dir: Path, envs: list[str]
) -> Teacher:
    """The teacher as served: a LoRA version's weights file copied beside the run (checked
    against its base), or the version written out as a model directory. Either is reused when
    an earlier start of this run left it for the same version and base."""
    import fsspec

    from rlbus.bus.store import open_store
    from rlbus.launch.model_export import apply_version, check_weights_file, find_version

    with open_store(cfg.store.url, read_only=True) as store:
        version, others = find_version(store, ref, cfg.store.url)
    pinned = VersionRef(ref.run_id, version.version)
    out = run_dir / "teachers" / f"{ref.run_id}@{version.version}"
    as_adapter = version.format == FORMATS["lora-delta"] and cfg.inference.backend == "hf"
    served = "adapter" if as_adapter else "model"
    written = {"version": str(pinned), "uri": version.uri, "base": str(base), "as": served}
    marker = out / EXPORTED
    adapter = out / "adapter.safetensors"
    if not (marker.is_file() and json.loads(marker.read_text()) == written):
        if as_adapter:
            check_weights_file(version, others)
            apply_version(version, base)  # ModelExportError when it does not fit its base
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            fs, path = fsspec.core.url_to_fs(version.uri)
            fs.get(path, str(adapter))
        else:
            export_version(cfg.store.url, pinned, out, base, force=True)
        marker.write_text(json.dumps(written))
    if as_adapter:
        return Teacher(pinned, base, tuple(envs), adapter)
    return Teacher(pinned, out, tuple(envs))
