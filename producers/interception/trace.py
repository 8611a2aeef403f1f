"""A rollout's trace graph: one node per message, parent links, branches, per-node token deltas.

Each model call's prompt is matched against the tree by canonical message keys. A prompt
that runs through the tip of a branch (its last sampled message) continues that branch, and
only then may the backend extend recorded ids instead of rendering afresh. Anything else (a
sub-agent with its own system prompt, parallel calls from one point, rewritten history) starts
a new branch. A node's `token_ids` are what its branch's context gained with it: the sampled
ids for a model message, the rendered delta for context (messages added by one call share one
delta, carried by the last of them). Nodes are shared between branches only where their ids
agree, so concatenating `token_ids` from a root to any node gives exactly the ids the backend
saw.

A response's id is its sampled node's id, so a client that continues a conversation by reference
(the Responses API's previous_response_id) continues that node's branch, and any response can be
found in the stored trace.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from rlbus.producers.interception.calls import CallResult, ModelCall, Prior, Tools
from rlbus.producers.interception.openai_messages import Message, canonical
from rlbus.producers.interception.wire import BadRequest
from rlbus.schemas import TokenRecord, TraceNode, derived_id
from rlbus.schemas.packed import pack_logprobs, pack_tokens

MAIN = "main"


@dataclass(eq=False)
class Node:
    index: int
    parent: Node | None
    branch: str
    message: Message
    key: str
    token_ids: list[int] = field(default_factory=list)
    call: Call | None = None
    """Set on sampled nodes: the call that produced the message."""
    children: dict[str, list[Node]] = field(default_factory=dict)
    """By canonical key; one key has several nodes when renderings of the same message differ."""


@dataclass(eq=False)
class Call:
    index: int
    branch: str
    result: CallResult
    seconds: float
    """From the plan to the commit: the backend's time alone."""
    ended_at: float
    node: Node | None = None


@dataclass
class Plan:
    """The branch a call extends (or starts), decided before the backend runs."""

    branch: str
    prior: Prior | None
    claimed_tip: Node | None
    started: float = field(default_factory=time.monotonic)


class Trace:
    def __init__(self, rollout_id: str):
        self.rollout_id = rollout_id
        self.roots: dict[str, list[Node]] = {}
        self.nodes: list[Node] = []
        self.calls: list[Call] = []
        self.tips: dict[str, Node | None] = {}
        """Each branch's last sampled node; None while a call extending it is in flight."""
        self.responses: dict[str, Node] = {}
        """Sampled nodes by their response id (Trace.response_id)."""
        self.tools: list[dict[str, Any]] = []
        """The tools offered to the model: each distinct one of every call, first offered
        first."""

    def node_id(self, node: Node) -> str:
        """Derived from the rollout, so a re-run republishes the same ids."""
        return derived_id(self.rollout_id, "node", node.index)

    def response_id(self, result: CallResult) -> str:
        """What a protocol names the response that returned `result`: its node's id as 32 hex
        digits (each protocol adds its own prefix: resp_, msg_, chatcmpl-)."""
        return self._response_key(self._node_of(result))

    def name_response(self, key: str, result: CallResult) -> None:
        """Let `key` (a streamed response's id, sent before its result existed) name the node
        that recorded `result` too."""
        self.responses[key] = self._node_of(result)

    def _node_of(self, result: CallResult) -> Node:
        call = next(c for c in reversed(self.calls) if c.result is result)
        assert call.node is not None
        return call.node

    def _response_key(self, node: Node) -> str:
        return uuid.UUID(self.node_id(node)).hex

    def continued(self, call: ModelCall) -> ModelCall:
        """`call` with the conversation of the response it continues in front of its messages.
        As with OpenAI's previous_response_id, instructions are not carried over: a leading
        system message of that conversation gives way to this call's own, if it has one."""
        if call.continues is None:
            return call
        node = self.responses.get(call.continues[-32:])  # any protocol's prefix, then the id
        if node is None:
            raise BadRequest(
                f"previous_response_id {call.continues!r} names no earlier response of this rollout"
            )
        history: list[Message] = []
        at: Node | None = node
        while at is not None:
            history.append(at.message)
            at = at.parent
        history.reverse()
        if history[0].get("role") == "system":
            history = history[1:]
        own = call.messages
        lead = own[:1] if own and own[0].get("role") == "system" else []
        return replace(call, messages=[*lead, *history, *own[len(lead) :]], continues=None)

    def _claimable_tip(self, messages: list[Message]) -> tuple[Node, int] | None:
        """A branch tip the messages run through (followed by at least one new message)."""

        def walk(level: dict[str, list[Node]], depth: int) -> tuple[Node, int] | None:
            if depth >= len(messages) - 1:
                return None
            for node in level.get(canonical(messages[depth]), ()):
                if node.call is not None and self.tips.get(node.branch) is node:
                    return node, depth + 1
                if found := walk(node.children, depth + 1):
                    return found
            return None

        return walk(self.roots, 0)

    def plan(self, messages: list[Message]) -> Plan:
        found = self._claimable_tip(messages)
        if found is not None:
            tip, depth = found
            self.tips[tip.branch] = (
                None  # claimed: a concurrent call from here starts its own branch
            )
            assert tip.call is not None
            result = tip.call.result
            return Plan(
                tip.branch, Prior(result.prompt_ids, result.completion_ids, messages[depth:]), tip
            )
        branch = MAIN if not self.tips else f"b{len(self.tips)}"
        self.tips[branch] = None
        return Plan(branch, None, None)

    def abandon(self, plan: Plan) -> None:
        """A call that failed leaves the branch as it was."""
        if plan.claimed_tip is not None:
            self.tips[plan.branch] = plan.claimed_tip
        elif self.tips.get(plan.branch) is None:
            del self.tips[plan.branch]

    def _shared_path(self, messages: list[Message], ids: list[int]) -> tuple[list[Node], int]:
        """The deepest existing path holding a prefix of `messages` whose ids are a prefix of `ids`,
        and how many ids it covers."""
        best: tuple[list[Node], int] = ([], 0)

        def walk(level: dict[str, list[Node]], path: list[Node], used: int) -> None:
            nonlocal best
            if len(path) > len(best[0]):
                best = (list(path), used)
            if len(path) == len(messages):
                return
            for node in level.get(canonical(messages[len(path)]), ()):
                if ids[used : used + len(node.token_ids)] == node.token_ids:
                    walk(node.children, [*path, node], used + len(node.token_ids))

        walk(self.roots, [], 0)
        path, used = best
        # Ids past the shared path need a new node to carry them: give up shared nodes until one
        # is left.
        while path and len(path) == len(messages) and used < len(ids):
            used -= len(path.pop().token_ids)
        return path, used

    def _add(
        self, parent: Node | None, message: Message, branch: str, token_ids: list[int]
    ) -> Node:
        node = Node(len(self.nodes), parent, branch, message, canonical(message), token_ids)
        (parent.children if parent else self.roots).setdefault(node.key, []).append(node)
        self.nodes.append(node)
        return node

    def commit(
        self, plan: Plan, messages: list[Message], result: CallResult, tools: Tools = None
    ) -> Call:
        self.tools += [t for t in tools or () if t not in self.tools]
        path, used = self._shared_path(messages, result.prompt_ids)
        rest = messages[len(path) :]
        delta = result.prompt_ids[used:]
        parent = path[-1] if path else None
        for i, message in enumerate(rest):
            parent = self._add(parent, message, plan.branch, delta if i == len(rest) - 1 else [])
        seconds = time.monotonic() - plan.started
        call = Call(len(self.calls), plan.branch, result, seconds, time.time())
        call.node = self._add(parent, result.message, plan.branch, list(result.completion_ids))
        call.node.call = call
        self.responses[self._response_key(call.node)] = call.node
        self.calls.append(call)
        self.tips[plan.branch] = call.node
        return call

    def completion(self, branch: str = MAIN) -> list[Message]:
        """What the branch added after its first call's prompt: sampled turns and the context
        between."""
        tip = self.tips.get(branch)
        chain: list[Message] = []
        first_sampled = next(
            (n for n in self.nodes if n.branch == branch and n.call is not None), None
        )
        while tip is not None:
            chain.append(tip.message)
            if tip is first_sampled:
                break
            tip = tip.parent
        return chain[::-1]

    def events(self, group_id: str) -> tuple[list[TraceNode], list[TokenRecord]]:
        """The trace as events, with ids derived from the rollout (a re-run republishes the same
        ids)."""
        node_ids = {n.index: self.node_id(n) for n in self.nodes}
        nodes = [
            TraceNode(
                event_id=derived_id(node_ids[n.index], "event"),
                node_id=node_ids[n.index],
                rollout_id=self.rollout_id,
                parent_id=node_ids[n.parent.index] if n.parent else "",
                branch_id=n.branch,
                index=n.index,
                role=n.message.get("role", ""),
                message=n.message,
                token_ids=pack_tokens(n.token_ids),
                sampled=n.call is not None,
                call_index=n.call.index if n.call else -1,
            )
            for n in self.nodes
        ]
        records = [
            TokenRecord(
                event_id=derived_id(self.rollout_id, "tokens", c.index),
                rollout_id=self.rollout_id,
                group_id=group_id,
                call_index=c.index,
                node_id=node_ids[c.node.index] if c.node else "",
                model=c.result.model,
                prompt_ids=pack_tokens(c.result.prompt_ids),
                completion_ids=pack_tokens(c.result.completion_ids),
                logprobs=pack_logprobs(c.result.logprobs),
                policy_version=c.result.policy_version,
                replica=c.result.replica,
                finish_reason=c.result.finish_reason,
                duration_s=c.seconds,
                ts=c.ended_at,
            )
            for c in self.calls
        ]
        return nodes, records

    def usage(self) -> dict[str, Any]:
        versions = [c.result.policy_version for c in self.calls] or [0]
        return {
            "prompt_tokens": sum(c.result.prompt_tokens for c in self.calls),
            "completion_tokens": sum(c.result.completion_tokens for c in self.calls),
            "min_policy_version": min(versions),
            "max_policy_version": max(versions),
            "num_turns": len(self.calls),
        }
