"""The trace -> training samples contract, shared by the orchestrator and `rlbus replay`: one
sample per branch, the branch's full context with a loss mask over the tokens its own calls
sampled (tokens a branch shares with its parent branch are context there, so no token is
trained twice)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rlbus.schemas.events import TokenRecord, TraceNode, TrainSample
from rlbus.schemas.packed import logprobs as unpack_logprobs
from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens
from rlbus.schemas.packed import tokens as unpack_tokens


class TraceError(ValueError):
    """A trace that does not hold together (missing parents or token records)."""


def branch_paths(nodes: Iterable[TraceNode]) -> dict[str, list[TraceNode]]:
    """Each branch's nodes from its root to its tip (its last node), in branch order."""
    by_id = {n.node_id: n for n in nodes}
    tips: dict[str, TraceNode] = {}
    for node in sorted(by_id.values(), key=lambda n: n.index):
        tips[node.branch_id] = node
    paths: dict[str, list[TraceNode]] = {}
    for branch, tip in tips.items():
        path = [tip]
        while path[-1].parent_id:
            parent = by_id.get(path[-1].parent_id)
            if parent is None:
                raise TraceError(
                    f"node {path[-1].node_id} of rollout {tip.rollout_id} names a missing parent "
                    f"{path[-1].parent_id}"
                )
            path.append(parent)
        paths[branch] = path[::-1]
    return paths


def trace_samples(nodes: Iterable[TraceNode], records: Iterable[TokenRecord]) -> list[TrainSample]:
    """Training samples of one rollout's trace, with advantages 0: the orchestrator's algorithm
    fills them in."""
    by_call = {r.call_index: r for r in records}
    samples = []
    for branch, path in branch_paths(nodes).items():
        ids, mask, lps = [], [], []
        versions = []
        for node in path:
            node_ids = unpack_tokens(node.token_ids)
            own = node.sampled and node.branch_id == branch
            ids.append(node_ids)
            mask.append(np.full(len(node_ids), own, dtype=np.uint8))
            if own:
                record = by_call.get(node.call_index)
                if record is None:
                    raise TraceError(
                        f"rollout {node.rollout_id}: no token record for call {node.call_index}"
                    )
                node_lps = unpack_logprobs(record.logprobs)
                if len(node_lps) != len(node_ids):
                    raise TraceError(
                        f"rollout {node.rollout_id} call {node.call_index}: {len(node_ids)} "
                        f"sampled "
                        f"ids but {len(node_lps)} log-probs"
                    )
                lps.append(node_lps)
                versions.append(record.policy_version)
            else:
                lps.append(np.zeros(len(node_ids), dtype=np.float32))
        all_mask = np.concatenate(mask) if mask else np.zeros(0, np.uint8)
        samples.append(
            TrainSample(
                rollout_id=path[-1].rollout_id,
                input_ids=pack_tokens(np.concatenate(ids) if ids else []),
                loss_mask=pack_mask(all_mask),
                advantages=pack_logprobs(np.zeros(len(all_mask), np.float32)),
                inference_logprobs=pack_logprobs(np.concatenate(lps) if lps else []),
                policy_version=min(versions, default=0),
            )
        )
    return samples
