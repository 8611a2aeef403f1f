"""A folder at an fsspec URL (local disk, s3://, gs://, ...) whose files are written atomically:
under a temporary name, then renamed, so a reader never sees a partial file and a crash leaves
the previous version whole. The claim check and the trainer's checkpoints both keep files so."""

from __future__ import annotations

import os
import posixpath
import uuid

import fsspec


def absolute_url(url: str) -> str:
    """`file://./x` and bare relative paths become absolute now, so every process (whatever its
    working directory) resolves the same files."""
    if "://" not in url:
        return "file://" + os.path.abspath(url)
    if url.startswith("file://") and not url.startswith("file:///"):
        return "file://" + os.path.abspath(url[len("file://") :])
    return url


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

    def read(self, rel: str) -> bytes:
        with self.fs.open(self.path(rel), "rb") as f:
            return f.read()

    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.path(rel))
