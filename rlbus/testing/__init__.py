"""Test and benchmark support (like torch.testing), not part of any role: no role or command
imports it, and of the launcher only the learning recipe, whose teacher is a scripted model
(`rlbus quickstart`). `scripted_server`: a scripted OpenAI-compatible model server (the test
double for a remote LLM); `in_process`: every role of a run in one event loop; `browser`:
Debian's headless chromium under Playwright, for the ui's browser tests and bench/analytics.py;
`cpu`: CPU seconds of this and other processes, for benchmarks; `token_records`: random
token records for the store path's tests and benchmarks.
"""

from rlbus.testing.cpu import CpuMeter, TreeCpuSampler, cpu_of, own_cpu, tree_cpu
from rlbus.testing.scripted_server import (
    ScriptedModel,
    ScriptedServer,
    reverse_task_word,
    serve,
    serve_in_child,
)

__all__ = [
    "CpuMeter",
    "ScriptedModel",
    "ScriptedServer",
    "TreeCpuSampler",
    "cpu_of",
    "own_cpu",
    "reverse_task_word",
    "serve",
    "serve_in_child",
    "tree_cpu",
]
