"""`run:RUN_ID@VERSION`: a weight version of a past run, as the store keeps it (its
`weight_versions` table). `rlbus model export` writes one as a model directory; an environment's
distillation teacher may name one (`[envs.NAME.algorithm] teacher`)."""

from __future__ import annotations

from dataclasses import dataclass

LATEST = "latest"
REF_FORM = "run:RUN_ID@VERSION (VERSION a number or latest)"


class VersionRefError(ValueError):
    """Text that names no stored version; the message says how to write one."""


@dataclass(frozen=True)
class VersionRef:
    """What `run:RUN_ID@VERSION` names."""

    run_id: str
    version: int | None
    """None: the newest stored."""

    @classmethod
    def parse(cls, text: str) -> VersionRef:
        scheme, _, rest = text.partition(":")
        run_id, at, version = rest.rpartition("@")
        if scheme != "run" or not at or not run_id:
            raise VersionRefError(f"{text!r} names no stored version; write {REF_FORM}")
        if version == LATEST:
            return cls(run_id, None)
        if not version.isdigit():
            raise VersionRefError(
                f"{text!r}: version {version!r} is neither a number nor {LATEST}; write {REF_FORM}"
            )
        return cls(run_id, int(version))

    def __str__(self) -> str:
        return f"run:{self.run_id}@{LATEST if self.version is None else self.version}"
