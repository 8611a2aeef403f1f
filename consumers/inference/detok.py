"""Incremental text for a growing list of token ids, with stop strings.

Decoding the whole completion at every step is quadratic; decoding only the new ids breaks
multi-byte characters and tokenizers that merge spaces across tokens. The window approach
(as in Hugging Face TGI's incremental decoding) re-decodes a short tail and emits text only
once it no longer ends in a partial character.
"""

from __future__ import annotations

from collections.abc import Callable

Decode = Callable[[list[int]], str]


class TextStream:
    """Feed token ids one at a time; read stable text, stop matches and what is safe to stream."""

    def __init__(self, decode: Decode, stop: list[str]) -> None:
        self._decode = decode
        self._stop = stop
        # Text that might still turn into a stop string must not be streamed yet.
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self.text = ""
        self.stopped_by: str | None = None
        self._emitted = 0

    def push(self, token_id: int) -> None:
        if self.stopped_by is not None:
            return
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return
        new = after[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        start = max(0, len(self.text) - self._holdback)
        self.text += new
        hits = [(at, s) for s in self._stop if (at := self.text.find(s, start)) != -1]
        if hits:
            at, self.stopped_by = min(hits)
            self.text = self.text[:at]

    def flush(self) -> str:
        """Text not yet handed out; while running, keeps back what could start a stop string."""
        end = (
            len(self.text)
            if self.stopped_by is not None
            else max(self._emitted, len(self.text) - self._holdback)
        )
        out = self.text[self._emitted : end]
        self._emitted = end
        return out

    def finish(self) -> str:
        """Everything not yet handed out (the completion is over, nothing can still match)."""
        out = self.text[self._emitted :]
        self._emitted = len(self.text)
        return out
