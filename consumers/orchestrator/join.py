"""Joining a rollout's pieces, which arrive on four topics in any order: its trace nodes, its
token records, the rollout and its score. A group is handed on once every member is whole."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from rlbus.environment.algorithm import GroupMember
from rlbus.schemas import Event, RolloutCompleted, RolloutScored, TokenRecord, TraceNode
from rlbus.schemas.samples import TraceError, trace_samples


@dataclass
class _Parts:
    first_seen: float = field(default_factory=time.monotonic)
    nodes: dict[str, TraceNode] = field(default_factory=dict)
    records: dict[int, TokenRecord] = field(default_factory=dict)
    rollout: RolloutCompleted | None = None
    scored: RolloutScored | None = None

    def whole(self) -> bool:
        if self.rollout is None or self.scored is None:
            return False
        if self.rollout.status != "ok":
            return True  # an errored rollout is not trained on; its trace may be partial
        if len(self.records) < self.rollout.num_turns:
            return False
        # The last node of a trace is the last call's sampled message; nodes are numbered
        # from 0 without gaps, so all of them are here when the count reaches that index.
        call_nodes = [self.nodes.get(r.node_id) for r in self.records.values()]
        if any(n is None for n in call_nodes):
            return False
        last = max((n.index for n in call_nodes if n is not None), default=-1)
        return len(self.nodes) >= last + 1


@dataclass
class Group:
    group_id: str
    env: str
    members: list[GroupMember]
    untrainable: int = 0
    """Members whose trace did not hold together (counted, not trained on)."""


class Joiner:
    def __init__(self, run_id: str, envs: set[str], temperature: Callable[[str], float]):
        self.run_id = run_id
        self.envs = envs
        self.temperature = temperature
        self.parts: dict[str, _Parts] = {}
        self.groups: dict[str, set[str]] = {}
        """group id -> rollout ids scored so far."""

    def add(self, event: Event) -> None:
        if isinstance(event, TraceNode):
            self._parts(event.rollout_id).nodes[event.node_id] = event
        elif isinstance(event, TokenRecord):
            self._parts(event.rollout_id).records[event.call_index] = event
        elif isinstance(event, RolloutCompleted) and event.env in self.envs:
            self._parts(event.rollout_id).rollout = event
        elif isinstance(event, RolloutScored) and event.env in self.envs:
            self._parts(event.rollout_id).scored = event
            self.groups.setdefault(event.group_id, set()).add(event.rollout_id)

    def expired(self, max_age_s: float) -> list[str]:
        """Rollouts first seen more than `max_age_s` ago and still not part of a whole group,
        removed from the joiner (their groups with them)."""
        cutoff = time.monotonic() - max_age_s
        old = {r for r, p in self.parts.items() if p.first_seen < cutoff}
        if not old:
            return []
        for group_id, members in list(self.groups.items()):
            if members & old:
                old |= members
                del self.groups[group_id]
        for rollout_id in old:
            self.parts.pop(rollout_id, None)
        return sorted(old)

    def _parts(self, rollout_id: str) -> _Parts:
        return self.parts.setdefault(rollout_id, _Parts())

    def ready(self) -> list[Group]:
        """Groups whose every member is whole, removed from the joiner."""
        out = []
        for group_id, members in list(self.groups.items()):
            parts = [self.parts[m] for m in members]
            size = next(p.scored.group_size for p in parts if p.scored is not None)
            if len(parts) < size or not all(p.whole() for p in parts):
                continue
            del self.groups[group_id]
            for m in members:
                del self.parts[m]
            out.append(self._group(group_id, parts))
        return out

    def _group(self, group_id: str, parts: list[_Parts]) -> Group:
        members, broken = [], 0
        # a group is built only once each of its parts is scored
        for p in sorted(parts, key=lambda p: p.scored.sample_index):  # type: ignore[union-attr]
            assert p.rollout is not None and p.scored is not None
            samples = []
            if p.rollout.status == "ok":
                try:
                    samples = trace_samples(p.nodes.values(), p.records.values())
                except TraceError:
                    broken += 1
                temperature = self.temperature(p.rollout.env)
                samples = [msgspec.structs.replace(s, temperature=temperature) for s in samples]
            members.append(GroupMember(p.scored, p.rollout, samples))
        return Group(group_id, members[0].rollout.env, members, broken)
