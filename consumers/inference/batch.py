"""Running sequences as one left-padded batch over a shared KV cache.

Sequences join (after their own prefill) and leave (when finished) between decode steps,
so every step runs all running sequences in one forward pass (continuous batching). Left
padding keeps each row's newest token in the last column; the 2-D attention mask hides the
padding and position ids count real tokens only, so a row's logits do not depend on the
other rows it happens to share a batch with.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A DynamicLayer that appends into spare room instead of re-concatenating the whole cache.

    DynamicLayer copies every cached key and value at every decode step (torch.cat); here the
    tensors live in a buffer with room to grow (doubling), so a step writes one position.
    `keys` / `values` stay views of the filled part, as the model and PaddedBatch expect.
    """

    def __init__(self) -> None:
        super().__init__()
        self._room: tuple[torch.Tensor, torch.Tensor] | None = None

    def cached(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values held; a batch's layers hold them from its prefill on."""
        assert self.keys is not None and self.values is not None, "layer read before its prefill"
        return self.keys, self.values

    def replace(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Set the cached tensors outright (PaddedBatch's select and merge)."""
        self.keys, self.values = keys, values
        self._room = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states[..., :0, :], value_states[..., :0, :]
        keys, values = self.cached()
        filled, new = keys.shape[-2], key_states.shape[-2]
        if self._room is None or filled + new > self._room[0].shape[-2]:
            capacity = max(64, 2 * (filled + new))
            grown = []
            for old, incoming in ((keys, key_states), (values, value_states)):
                buffer = incoming.new_empty((*incoming.shape[:-2], capacity, incoming.shape[-1]))
                buffer[..., :filled, :] = old
                grown.append(buffer)
            self._room = (grown[0], grown[1])
        keys_room, values_room = self._room
        keys_room[..., filled : filled + new, :] = key_states
        values_room[..., filled : filled + new, :] = value_states
        self.keys = keys_room[..., : filled + new, :]
        self.values = values_room[..., : filled + new, :]
        return self.keys, self.values


def _new_cache(model: PreTrainedModel) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    cache.layers[:] = [GrowingLayer() for _ in cache.layers]
    return cache


def _growing_layers(cache: DynamicCache) -> list[GrowingLayer]:
    """A cache's layers, each a GrowingLayer: every cache here comes from _new_cache."""
    return cast(list[GrowingLayer], cache.layers)


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    # F.pad lists (left, right) pairs from the last dimension backwards.
    pad = [0, 0] * (t.dim() - 1 - dim % t.dim()) + [missing, 0]
    return F.pad(t, pad)


class PaddedBatch:
    """KV cache [B, H, T, D] per layer, mask [B, T] (1: real token), lengths [B] (next position)."""

    cache: DynamicCache  # of GrowingLayers

    def __init__(self, cache: DynamicCache, mask: torch.Tensor, lengths: torch.Tensor) -> None:
        self.cache = cache
        self.mask = mask
        self.lengths = lengths

    @property
    def size(self) -> int:
        return int(self.mask.shape[0])

    @staticmethod
    def check_supported(model: PreTrainedModel) -> None:
        """Only full-attention DynamicLayers can be padded, merged and sliced this way."""
        probe = DynamicCache(config=model.config)
        kinds = {type(layer) for layer in probe.layers}
        if kinds - {DynamicLayer}:
            names = sorted(k.__name__ for k in kinds)
            raise ValueError(
                f"{type(model).__name__} uses cache layers {names}; the built-in engine supports "
                "full-attention models only (use --backend vllm for this model)"
            )

    @classmethod
    def prefill(
        cls, model: PreTrainedModel, sequences: list[list[int]]
    ) -> tuple[PaddedBatch, torch.Tensor]:
        """Run the sequences through the model; return the batch and next-token logits [B, V]."""
        device = model.device
        width = max(len(s) for s in sequences)
        ids = torch.zeros((len(sequences), width), dtype=torch.long, device=device)
        mask = torch.zeros((len(sequences), width), dtype=torch.long, device=device)
        for row, seq in enumerate(sequences):
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = _new_cache(model)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return cls(cache, mask, mask.sum(-1)), out.logits[:, -1]

    def decode(self, model: PreTrainedModel, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; return next-token logits [B, V]."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.size, 1))], dim=1)
        out = model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=self.lengths[:, None],
            cache=self.cache,
            use_cache=True,
        )
        self.lengths = self.lengths + 1
        return out.logits[:, -1]

    def select(self, keep: torch.Tensor) -> None:
        """Keep only rows `keep` (indices), then drop padding columns no remaining row needs."""
        mask = self.mask.index_select(0, keep)
        first = int(mask.any(0).int().argmax()) if mask.numel() else 0
        self.mask = mask[:, first:]
        self.lengths = self.lengths.index_select(0, keep)
        for layer in _growing_layers(self.cache):
            keys, values = layer.cached()
            layer.replace(
                keys.index_select(0, keep)[:, :, first:], values.index_select(0, keep)[:, :, first:]
            )

    def merge(self, other: PaddedBatch) -> None:
        """Append `other`'s rows after this batch's rows, padding the shorter on the left."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        self.mask = torch.cat(
            [_left_pad(self.mask, width, 1), _left_pad(other.mask, width, 1)], dim=0
        )
        self.lengths = torch.cat([self.lengths, other.lengths])
        for mine, theirs in zip(
            _growing_layers(self.cache), _growing_layers(other.cache), strict=True
        ):
            (my_keys, my_values), (their_keys, their_values) = mine.cached(), theirs.cached()
            mine.replace(
                torch.cat([_left_pad(my_keys, width, 2), _left_pad(their_keys, width, 2)], dim=0),
                torch.cat(
                    [_left_pad(my_values, width, 2), _left_pad(their_values, width, 2)], dim=0
                ),
            )
