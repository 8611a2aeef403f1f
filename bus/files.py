"""A folder at an fsspec URL (local disk, s3://, gs://, ...) whose files are written atomically:
under a temporary name, then renamed, so a reader never sees a partial file and a crash leaves
the previous version whole. The claim check and the trainer's checkpoints both keep files so."""

from __future__ import annotations

import os
import posixpath
import stat
import tempfile
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import fsspec


def absolute_url(url: str) -> str:
    """`file://./x` and bare relative paths become absolute now, so every process (whatever its
    working directory) resolves the same files."""
    if "://" not in url:
        return "file://" + os.path.abspath(url)
    if url.startswith("file://") and not url.startswith("file:///"):
        return "file://" + os.path.abspath(url[len("file://") :])
    return url


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether an fsspec file system is this machine's disk."""
    protocol = fs.protocol
    return "file" in ((protocol,) if isinstance(protocol, str) else protocol)


class Folder:
    def __init__(self, url: str):
        self.url = absolute_url(url).rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)

    def uri(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def path(self, rel: str) -> str:
        return posixpath.join(self.root, rel)

    def write(self, rel: str, data: bytes) -> str:
        """Write `data` to `rel` atomically; returns its path in the file system."""
        path = self.path(rel)
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.mv(tmp, path)
        return path

    def write_file(self, rel: str, write: Callable[[str], None]) -> int:
        """Write `rel` atomically with `write(local_path)`, a serializer that streams to a file
        (safetensors, torch.save) instead of building the whole file in memory first: for
        weights of hundreds of MB that copy costs more than the write. On a remote file system
        the file is written locally, then uploaded. Returns its size in bytes."""
        path = self.path(rel)
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        if self.local:
            write(tmp)
            size = os.path.getsize(tmp)
        else:
            with tempfile.TemporaryDirectory(prefix="rlbus-upload-") as scratch:
                local = os.path.join(scratch, posixpath.basename(path))
                write(local)
                size = os.path.getsize(local)
                self.fs.put_file(local, tmp)
        self.fs.mv(tmp, path)
        return size

    def read(self, rel: str) -> bytes:
        with self.fs.open(self.path(rel), "rb") as f:
            return f.read()

    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.path(rel))

    @property
    def local(self) -> bool:
        return is_local(self.fs)

    def read_regular(self, rel: str, size: int) -> bytes:
        """The file `rel`, which must be a regular file (not a link, FIFO or device) of exactly
        `size` bytes; ValueError says which it is not, FileNotFoundError when it is gone."""
        path = self.path(rel)
        if not self.local:
            info = self.fs.info(path)
            if info.get("type") != "file":
                raise ValueError(f"{rel} is not a regular file ({info.get('type')})")
            if info.get("size") != size:
                raise ValueError(f"{rel} holds {info.get('size')} bytes, its stub says {size}")
            data = self.fs.cat_file(path, start=0, end=size)
        else:
            # Non-blocking open: a FIFO opens at once (and is refused below) instead of waiting
            # for a writer; no-follow: a link is refused, not read.
            flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(path, flags)
            except OSError as exc:
                if isinstance(exc, FileNotFoundError):
                    raise
                raise ValueError(f"{rel} cannot be opened as a regular file: {exc}") from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise ValueError(f"{rel} is not a regular file")
                if st.st_size != size:
                    raise ValueError(f"{rel} holds {st.st_size} bytes, its stub says {size}")
                data = os.pread(fd, size, 0)
            finally:
                os.close(fd)
        if len(data) != size:
            raise ValueError(f"{rel}: read {len(data)} bytes, its stub says {size}")
        return data

    def delete_older(self, cutoff: float) -> int:
        """Delete the files last modified before `cutoff` (a Unix time); returns how many."""
        deleted = 0
        for path, info in self.fs.find(self.root, detail=True).items():
            modified = _modified(info)
            if info.get("type") == "file" and modified is not None and modified < cutoff:
                self.fs.rm_file(path)
                deleted += 1
        return deleted


def _modified(info: dict[str, Any]) -> float | None:
    """A file's modification time from fsspec's info, which file systems spell differently."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "mtime_ns"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, int | float):
            return value / 1e9 if key == "mtime_ns" else float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None
