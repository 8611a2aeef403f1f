"""Distillation teachers named by a stored version (`[envs.NAME.algorithm] teacher =
"run:RUN_ID@VERSION"`), made ready before `rlbus run` starts anything.

A teacher is a weight version a past run announced on `weights` and the sink kept in
`weight_versions`: it is found in this run's store, written out as a model directory (the way
`rlbus model export` writes one, onto `teacher_base`, default this run's model) under the run's
directory, and served by an inference replica of its own that follows no run's weights. `@latest`
is pinned to the newest stored version when the run starts. A teacher that is not in the store,
whose weights file is gone, that does not fit its base, or whose tokenizer is not the student's
(its log-probs would score other tokens) refuses the run, naming the environment and the teacher.
Environments that name the same version share one export and one server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlbus.config.runs import RunConfig
from rlbus.config.version_ref import VersionRef
from rlbus.launch.model_export import ModelExportError, export_version

EXPORTED = ".rlbus-teacher.json"
"""In a teacher's directory: the stored version it was written from (a resumed run reuses it)."""


class TeacherError(Exception):
    """A teacher the run cannot use; the message names the environment, the teacher and why."""


@dataclass(frozen=True)
class Teacher:
    ref: VersionRef
    """The version, pinned (`@latest` resolved)."""
    model_dir: Path
    envs: tuple[str, ...]
    """The environments it teaches."""

    @property
    def name(self) -> str:
        return f"teacher-{self.ref.run_id}-v{self.ref.version}"


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


def prepare_teachers(cfg: RunConfig, run_dir: Path) -> list[Teacher]:
    """Every stored-version teacher of `cfg`'s environments, written out under
    `run_dir`/teachers, or TeacherError for the first that cannot be."""
    student = model_dir(cfg.model)
    found: dict[tuple[str, Path], list[str]] = {}
    for env, entry in cfg.envs.items():
        algorithm = entry.algorithm
        if algorithm.teacher:
            key = (algorithm.teacher, model_dir(algorithm.teacher_base or cfg.model))
            found.setdefault(key, []).append(env)
    teachers: list[Teacher] = []
    for (text, base), envs in found.items():
        where = f"envs.{envs[0]}.algorithm.teacher = {text!r}"
        try:
            check_same_tokenizer(student, base, where)
            teachers.append(write_teacher(cfg, VersionRef.parse(text), base, run_dir, envs))
        except ModelExportError as exc:
            raise TeacherError(f"{where}: {exc}") from None
    return teachers


def write_teacher(
    cfg: RunConfig, ref: VersionRef, base: Path, run_dir: Path, envs: list[str]
) -> Teacher:
    """The teacher's model directory, written unless a directory of the same version and base
    is there from an earlier start of this run."""
    from rlbus.bus.store import open_store
    from rlbus.launch.model_export import find_version

    with open_store(cfg.store.url, read_only=True) as store:
        version, _ = find_version(store, ref, cfg.store.url)
    pinned = VersionRef(ref.run_id, version.version)
    out = run_dir / "teachers" / f"{ref.run_id}@{version.version}"
    written = {"version": str(pinned), "uri": version.uri, "base": str(base)}
    marker = out / EXPORTED
    if not (marker.is_file() and json.loads(marker.read_text()) == written):
        export_version(cfg.store.url, pinned, out, base, force=True)
        marker.write_text(json.dumps(written))
    return Teacher(pinned, out, tuple(envs))
