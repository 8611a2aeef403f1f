"""A SlotBatch's decode steps replayed from CUDA graphs, one captured per bucket.

A small model's decode step on a GPU is bound by launching its kernels (~1,100 a step for
SmolLM2's shape: 29 ms of wall time for ~8 ms of GPU work, issue 33). A CUDA graph launches a
captured step's kernels at once; it replays them over the tensors they were captured with, which
is what a SlotBatch keeps fixed: its cache, its token and position inputs, and the windows of its
(batch, length) buckets. Every bucket is captured once, when the engine starts (largest first,
sharing one memory pool, as vLLM does), while no sequence holds a slot: the captures' writes land
at position 0 of free slots. Weight swaps and LoRA merges copy into the parameters in place, so
the graphs read the new weights.
"""

from __future__ import annotations

import logging
import time

import torch

from rlbus.consumers.inference.slots import SlotBatch

log = logging.getLogger(__name__)

WARMUP_STEPS = 2
"""Eager runs of a bucket before its capture (lazy initialisations, cuBLAS workspaces)."""


class DecodeGraphs:
    """The captured steps of one SlotBatch; `capture` makes the batch replay them."""

    def __init__(self, batch: SlotBatch) -> None:
        if batch.tokens.device.type != "cuda":
            device = batch.tokens.device
            raise ValueError(f"CUDA graphs capture CUDA work; the batch is on {device}")
        self.batch = batch
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def capture(self) -> float:
        """Capture a step of every bucket; the seconds it took."""
        if self.batch.size:
            raise RuntimeError("captures write into free slots: capture before any sequence joins")
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.batch.tokens.device)
        shapes = [
            (b, n)
            for b in reversed(self.batch.batch_buckets)
            for n in reversed(self.batch.length_buckets)
        ]
        for b, n in shapes:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    self.batch.step(b, n)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self.batch.step(b, n)
            self._graphs[b, n] = (graph, logits)
        torch.cuda.synchronize()
        self.batch.run = self.replay
        elapsed = time.perf_counter() - started
        log.info("captured %d decode steps in %.1f s", len(shapes), elapsed)
        return elapsed

    def replay(self, batch: int, length: int) -> torch.Tensor:
        graph, logits = self._graphs[batch, length]
        graph.replay()
        return logits
