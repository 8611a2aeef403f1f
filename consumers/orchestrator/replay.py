"""Training samples from the store: the exact token ids and loss masks of stored rollouts
(trace nodes + token records), never re-rendered text. `rlbus replay sft` trains on them."""

from __future__ import annotations

from collections import defaultdict

from rlbus.bus.store import Store
from rlbus.consumers.orchestrator.algorithms import AlgorithmConfig, GroupMember, make_algorithm
from rlbus.schemas import RolloutCompleted, RolloutScored, TokenRecord, TraceNode, TrainSample
from rlbus.schemas.samples import trace_samples


class ReplayError(ValueError):
    """The selection matched nothing usable; the message says what was found."""


def selected_rollouts(store: Store, where: str, run_id: str | None) -> list[RolloutScored]:
    """Scored rollouts matching `where` (SQL over the `scored` table's columns), ordered by task and
    sample, so that the same selection trains the same way however the store returns rows."""
    condition = f"({where}) AND status = 'ok'" if where else "status = 'ok'"
    params = {}
    if run_id:
        condition += " AND run_id = {run:String}"
        params["run"] = run_id
    rows = store.read_events(RolloutScored, condition, parameters=params)
    return sorted(rows, key=lambda s: (s.task_id, s.sample_index, s.run_id, s.rollout_id))


async def stored_samples(store: Store, where: str, run_id: str | None = None) -> list[TrainSample]:
    """SFT samples of the matching rollouts: one per trace branch, supervised on sampled tokens."""
    scored = selected_rollouts(store, where, run_id)
    if not scored:
        raise ReplayError(
            f"no scored rollout matches {where!r}{f' in run {run_id}' if run_id else ''}"
        )
    ids = [s.rollout_id for s in scored]
    params = {"ids": ids}
    nodes: dict[str, list[TraceNode]] = defaultdict(list)
    for n in store.read_events(TraceNode, "rollout_id IN {ids:Array(String)}", parameters=params):
        nodes[n.rollout_id].append(n)
    records: dict[str, list[TokenRecord]] = defaultdict(list)
    for r in store.read_events(TokenRecord, "rollout_id IN {ids:Array(String)}", parameters=params):
        records[r.rollout_id].append(r)
    missing = [i for i in ids if not records.get(i)]
    if len(missing) == len(ids):
        raise ReplayError(
            f"{len(ids)} rollouts match but none has token records: they were not sampled in "
            "train mode (token ids are only known for rollouts run through the inference server)"
        )
    algo = make_algorithm(AlgorithmConfig(name="sft"))
    out: list[TrainSample] = []
    for s in scored:
        if s.rollout_id in missing:
            continue
        samples = trace_samples(nodes[s.rollout_id], records[s.rollout_id])
        rollout = RolloutCompleted(
            rollout_id=s.rollout_id, group_id=s.group_id, task_id=s.task_id, env=s.env
        )
        out.extend(await algo.samples([GroupMember(s, rollout, samples)]))
    return out
