"""What `rlbus quickstart` reads (rlbus.launch.quickstart: each stage's figures, its progress;
rlbus.commands.quickstart: the queries it prints to try). Its held-out and reward figures are
the recipe's (reads/recipe.py)."""

from __future__ import annotations

from rlbus.bus.store.reads.common import ROLLOUTS, RUN
from rlbus.schemas import TOPICS

COUNTS = {
    "rollouts": f"SELECT {ROLLOUTS} FROM rollouts WHERE {RUN}",
    "events": "SELECT sum(n) FROM ("
    + " UNION ALL ".join(
        f"SELECT count() AS n FROM {kind.table} FINAL WHERE run_id = {{run:String}}"
        for topic in TOPICS
        for kind in topic.kinds
    )
    + ")",
    "tokens": "SELECT (SELECT sum(length(prompt_ids) + length(completion_ids)) FROM tokens FINAL "
    "WHERE run_id = {run:String}) + (SELECT sum(num_tokens) FROM batches FINAL "
    "WHERE run_id = {run:String})",
}
"""Each stage's figures, read from the store: its rollouts, its events of every kind, and its
tokens (prompt and completion of every model call, plus every token trained on)."""
LANDED = "SELECT count() FROM tasks FINAL WHERE run_id IN {runs:Array(String)}"
"""The published tasks of the given runs that are stored."""
PRESENT = "SELECT count() FROM tasks FINAL WHERE startsWith(run_id, {prefix:String})"
"""Tasks of an earlier quickstart with the same prefix."""
NEWEST_STEP = "SELECT max(step) FROM train_steps FINAL WHERE run_id = {run:String}"
"""The RL stage's progress: its newest trainer step in the store."""


def to_try(prefix: str, rl_run: str, final_version: int) -> list[str]:
    """Queries over a quickstart's runs (PREFIX-...; the RL stage's `rl_run`, whose last held-out
    evaluation is `final_version`'s) that it prints for `rlbus sql`: values written in, not
    bound, so they can be pasted as they are."""
    return [
        "SELECT run_id, step AS version, held_out_rollouts, "
        "round(held_out_mean_reward, 3) AS held_out_reward FROM reward_by_step "
        f"WHERE startsWith(run_id, '{prefix}-') AND held_out_rollouts > 0 "
        "ORDER BY first_ts",
        "SELECT step, train_rollouts, round(train_mean_reward, 3) AS train_reward "
        f"FROM reward_by_step WHERE run_id = '{rl_run}' ORDER BY step",
        "SELECT r.answer, JSONExtractString(r.completion, 1, 'content') AS reply, s.reward "
        "FROM rollouts AS r FINAL INNER JOIN scored AS s FINAL ON r.rollout_id = s.rollout_id "
        f"WHERE r.run_id = '{rl_run}' "
        f"AND JSONExtractInt(r.info, 'eval_version') = {final_version} LIMIT 8",
    ]
