"""Running sequences in the slots of a static KV cache, so that decode steps repeat their shapes.

PaddedBatch (batch.py) grows, re-pads and re-slices its cache as sequences come and go, so no
two decode steps need share a shape: right on a CPU, where a step costs its arithmetic. On a GPU
a small model's step is bound by launching its ~1,000 kernels instead, and the remedy, replaying
a captured step (decode_graphs.py), replays it over the same memory and shapes only. Here each
sequence holds a slot, one row of a cache allocated once ([slots, kv heads, length, head dim]
per layer), from position 0 on; a step runs the first `b` slots over the first `l` positions,
both rounded up to a bucket, so every step is one of a few shapes over the same tensors.

Slots are taken lowest first; when the live sequences would fit a smaller batch bucket, the
highest move down. A free slot below the highest live one is computed with the others and its
output ignored; its position is held at 0, so its writes stay in its own row, where nothing
reads them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import cast

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin

from rlbus.consumers.inference.batch import GrowingLayer, PaddedBatch
from rlbus.consumers.model_size import available_bytes, gb

MIN_LENGTH_BUCKET = 256
"""The shortest span of positions a step attends over; longer spans double up to the cache's."""
KV_SHARE = 0.5
"""Of the memory free once the weights are loaded, the most a static cache takes by default."""


def buckets(smallest: int, largest: int) -> list[int]:
    """Powers of two from `smallest` below `largest`, then `largest`: the sizes steps round to."""
    sizes = []
    size = smallest
    while size < largest:
        sizes.append(size)
        size *= 2
    return [*sizes, largest]


def round_up(n: int, sizes: list[int]) -> int:
    """The smallest of `sizes` (ascending) that holds `n`."""
    for size in sizes:
        if size >= n:
            return size
    raise ValueError(f"{n} is more than the largest bucket {sizes[-1]}")


class SlotLayer(CacheLayerMixin):
    """One layer's static keys and values; a step reads the window `use` set and writes each
    row's new key and value at that row's position."""

    is_compileable = True
    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.all_keys, self.all_values = keys, values
        self.is_initialized = True
        self._all_rows = torch.arange(keys.shape[0], device=keys.device)
        self._rows = self._positions = self._all_rows

    def use(self, batch: int, length: int, positions: torch.Tensor) -> None:
        """Read slots [0, batch) over positions [0, length); write at `positions` [batch]."""
        self.keys = self.all_keys[:batch, :, :length]
        self.values = self.all_values[:batch, :, :length]
        self._rows, self._positions = self._all_rows[:batch], positions

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise AssertionError("slot layers are allocated before their first step")

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.keys is not None and self.values is not None
        # One new position per row: [rows, heads, 1, dim] lands at [row, :, position, :].
        self.keys[self._rows, :, self._positions] = key_states[:, :, 0]
        self.values[self._rows, :, self._positions] = value_states[:, :, 0]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        assert self.keys is not None
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        assert self.keys is not None
        return self.keys.shape[2]

    def get_max_length(self) -> int:
        return self.all_keys.shape[2]


class SlotCache(Cache):
    """The static cache a step passes to the model (a transformers Cache of SlotLayers)."""

    def __init__(self, layers: list[SlotLayer]) -> None:
        super().__init__(layers=list(layers))

    @property
    def slot_layers(self) -> list[SlotLayer]:
        return cast(list[SlotLayer], self.layers)


def _probe_layers(model: PreTrainedModel) -> list[torch.Tensor]:
    """Each layer's key states for one token: their heads, head size and dtype."""
    with torch.inference_mode():
        prefilled, _ = PaddedBatch.prefill(model, [[0]])
    return [layer.cached()[0] for layer in cast(list[GrowingLayer], prefilled.cache.layers)]


def _position_bytes(probes: list[torch.Tensor]) -> int:
    return sum(2 * k[0, :, 0].numel() * k.element_size() for k in probes)


def bytes_per_slot_position(model: PreTrainedModel) -> int:
    """KV cache bytes one position of one slot takes, over every layer."""
    return _position_bytes(_probe_layers(model))


def _default_length(
    device: torch.device, context: int, slots: int, slot_position_bytes: int
) -> int:
    """Positions per slot: the model's `context`, or as many as KV_SHARE of the memory free on
    `device` holds for `slots` slots (a multiple of 16)."""
    per_position = slot_position_bytes * slots
    free = available_bytes(str(device))
    length = context if free is None else min(context, int(free * KV_SHARE) // per_position)
    if length < MIN_LENGTH_BUCKET:
        raise ValueError(
            f"a static KV cache of {slots} slots holds {length} positions in {KV_SHARE:.0%} of "
            f"the {gb(free or 0)} free on {device} ({gb(per_position)} a position); "
            "set inference.hf.cache_length (positions per slot) or inference.hf.decode = "
            '"dynamic"'
        )
    return length // 16 * 16


DecodeStep = Callable[[int, int], torch.Tensor]
"""A step over the first `b` slots and `l` positions: next-token logits [b, vocab]."""


class SlotBatch:
    """The engine's running sequences in a static cache: PaddedBatch's decode, select and merge,
    over slots. `run` executes a step of a given bucket (eagerly, or by replaying a capture:
    decode_graphs.py); the step itself is `step`."""

    def __init__(self, model: PreTrainedModel, slots: int, length: int | None = None) -> None:
        """`length`: positions per slot (default: _default_length), at most the context."""
        probes = _probe_layers(model)
        context = int(model.config.get_text_config().max_position_embeddings)
        if not length:
            length = _default_length(model.device, context, slots, _position_bytes(probes))
        length = min(length, context)
        self.model = model
        self.slots, self.length = slots, length
        layers = []
        for probe in probes:
            shape = (slots, probe.shape[1], length, probe.shape[3])
            layers.append(
                SlotLayer(
                    torch.zeros(shape, dtype=probe.dtype, device=probe.device),
                    torch.zeros(shape, dtype=probe.dtype, device=probe.device),
                )
            )
        self.cache = SlotCache(layers)
        device = model.device
        # The step's inputs, at fixed addresses: each slot's next token and its position.
        self.tokens = torch.zeros(slots, dtype=torch.long, device=device)
        self.positions = torch.zeros(slots, dtype=torch.long, device=device)
        self._span = torch.arange(length, device=device)
        self._float_mask = model.config._attn_implementation == "eager"
        self.batch_buckets = buckets(1, slots)
        self.length_buckets = buckets(min(MIN_LENGTH_BUCKET, length), length)
        self.run: DecodeStep = self.step
        # Host-side bookkeeping (no device reads): the slot of each row, in row order, and the
        # number of positions each holds.
        self._slot_of_row: list[int] = []
        self._filled: list[int] = []
        self._free = list(range(slots))
        self._rows_index: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return len(self._slot_of_row)

    def step(self, batch: int, length: int) -> torch.Tensor:
        """One decode step over slots [0, batch) and positions [0, length)."""
        positions = self.positions[:batch]
        for layer in self.cache.slot_layers:
            layer.use(batch, length, positions)
        visible = self._span[:length] <= positions[:, None]
        if self._float_mask:
            mask = torch.zeros(visible.shape, dtype=self.model.dtype, device=visible.device)
            mask = mask.masked_fill(~visible, torch.finfo(self.model.dtype).min)
        else:
            mask = visible
        out = self.model(
            input_ids=self.tokens[:batch, None],
            attention_mask=mask[:, None, None, :],
            position_ids=positions[:, None],
            cache=self.cache,
            use_cache=True,
        )
        return out.logits[:, -1]

    def shape(self) -> tuple[int, int]:
        """The bucket the next step runs in."""
        rows = round_up(max(self._slot_of_row) + 1, self.batch_buckets)
        return rows, round_up(max(self._filled) + 1, self.length_buckets)

    def decode(self, model: PreTrainedModel, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; return next-token logits [rows, vocab]."""
        rows = self._index()
        self.tokens.index_copy_(0, rows, tokens)
        logits = self.run(*self.shape()).index_select(0, rows)
        self.positions.index_add_(0, rows, torch.ones_like(rows))
        self._filled = [n + 1 for n in self._filled]
        return logits

    def select(self, keep: torch.Tensor) -> None:
        """Keep only rows `keep` (indices, in this order); free the others' slots."""
        kept = keep.tolist()
        gone = set(range(self.size)) - set(kept)
        for row in gone:
            slot = self._slot_of_row[row]
            heapq.heappush(self._free, slot)
        if gone:
            freed = torch.tensor(
                [self._slot_of_row[r] for r in gone], dtype=torch.long, device=self.tokens.device
            )
            self.positions.index_fill_(0, freed, 0)
        self._slot_of_row = [self._slot_of_row[r] for r in kept]
        self._filled = [self._filled[r] for r in kept]
        self._rows_index = None
        self._compact()

    def merge(self, other: PaddedBatch) -> None:
        """Take `other`'s rows (a prefill's) into free slots, after this batch's rows."""
        n, width = other.size, other.mask.shape[1]
        if n > len(self._free):
            raise ValueError(f"{n} sequences join {self.size} in {self.slots} slots")
        if width > self.length:
            raise ValueError(f"a {width}-token prefill exceeds the cache's {self.length} positions")
        slots = [heapq.heappop(self._free) for _ in range(n)]
        lengths = other.lengths.tolist()
        device = self.tokens.device
        target = torch.tensor(slots, dtype=torch.long, device=device)
        # Row r's tokens are its last lengths[r] columns (left padding): position p reads column
        # width - lengths[r] + p; positions past its length read padding, which its mask hides.
        start = (width - other.lengths)[:, None]
        source = (start + torch.arange(width, device=device)[None, :]).clamp(max=width - 1)
        for mine, theirs in zip(
            self.cache.slot_layers, cast(list[GrowingLayer], other.cache.layers), strict=True
        ):
            for into, cached in zip((mine.all_keys, mine.all_values), theirs.cached(), strict=True):
                index = source[:, None, :, None].expand(-1, cached.shape[1], -1, cached.shape[3])
                into[target, :, :width] = cached.gather(2, index)
        self.positions.index_copy_(0, target, other.lengths.to(device))
        self._slot_of_row += slots
        self._filled += lengths
        self._rows_index = None

    def restart(self, other: PaddedBatch) -> SlotBatch:
        """Hold `other`'s rows alone (the engine's batch had emptied)."""
        self._slot_of_row, self._filled = [], []
        self._free = list(range(self.slots))
        self.positions.zero_()
        self.merge(other)
        return self

    def _index(self) -> torch.Tensor:
        if self._rows_index is None:
            self._rows_index = torch.tensor(
                self._slot_of_row, dtype=torch.long, device=self.tokens.device
            )
        return self._rows_index

    def _compact(self) -> None:
        """Move the highest rows into the lowest free slots when that shrinks the batch bucket."""
        if not self._slot_of_row:
            return
        fits = round_up(self.size, self.batch_buckets)
        if max(self._slot_of_row) < fits:
            return
        moves = []
        for row in sorted(range(self.size), key=lambda r: -self._slot_of_row[r]):
            slot = self._slot_of_row[row]
            if slot < fits:
                break
            lower = heapq.heappop(self._free)
            heapq.heappush(self._free, slot)
            moves.append((slot, lower))
            self._slot_of_row[row] = lower
        device = self.tokens.device
        source = torch.tensor([m[0] for m in moves], dtype=torch.long, device=device)
        target = torch.tensor([m[1] for m in moves], dtype=torch.long, device=device)
        held = max(self._filled)
        for layer in self.cache.slot_layers:
            for tensor in (layer.all_keys, layer.all_values):
                tensor[target, :, :held] = tensor[source, :, :held]
        self.positions.index_copy_(0, target, self.positions.index_select(0, source))
        self.positions.index_fill_(0, source, 0)
        self._rows_index = None
