"""Test and benchmark support, outside the installed package (benchmarks put `tests/` on
sys.path). It re-exports the scripted model server (`rlbus.launch.scripted_model`: the
quickstart's teacher, and the test double for a remote LLM); `in_process`: every role of a run
in one event loop; `browser`:
Debian's headless chromium under Playwright, for the ui's browser tests and bench/analytics.py;
`cpu`: CPU seconds of this and other processes, for benchmarks; `token_records`: random
token records for the store path's tests and benchmarks.
"""

from rlbus.launch.scripted_model import (
    ScriptedModel,
    ScriptedServer,
    reverse_task_word,
    serve_in_child,
    serve_scripted,
)
from support.cpu import CpuMeter, TreeCpuSampler, cpu_of, own_cpu, tree_cpu

__all__ = [
    "CpuMeter",
    "ScriptedModel",
    "ScriptedServer",
    "TreeCpuSampler",
    "cpu_of",
    "own_cpu",
    "reverse_task_word",
    "serve_scripted",
    "serve_in_child",
    "tree_cpu",
]
