"""reverse_text as a tiny model from init can learn it in minutes on 2 CPU cores: the user
turn is the bare word (no system prompt, no instruction); ../recipe.py gives the model a chat
template with no role headers. Tasks, ids, answers and rewards are reverse_text's own.

Measured here (RESULTS.md): with ~25 constant tokens (instruction + chat headers) before the
word, a 0.9M-parameter model's SFT loss stays near 2.8 nats/token after 600-1200 steps; with
the word alone it falls to 0.2 within 100 steps.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "reverse_text_env", Path(__file__).with_name("env.py")
)
assert _spec is not None and _spec.loader is not None
_env = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_env)


class TerseReverseText(_env.ReverseText):
    system_prompt = None

    def messages(self, task):
        return [{"role": "user", "content": task.answer[::-1]}]
