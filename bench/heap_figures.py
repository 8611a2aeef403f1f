"""This process's memory as the heap benches sample it: its anonymous RSS and glibc's heap
(`mallinfo2`: the arena, and what of it is in use), in MB."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_mb() -> dict[str, float]:
    """{"anon": anonymous RSS, "arena": glibc's arena, "in_use": glibc's heap in use}."""
    anon = re.search(r"RssAnon:\s+(\d+)", Path("/proc/self/status").read_text())
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return {
        "anon": int(anon[1]) / 1024 if anon else 0.0,
        "arena": info.arena / 2**20,
        "in_use": info.uordblks / 2**20,
    }
