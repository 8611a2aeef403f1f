"""What `rlbus rescore` reads (rlbus.launch.rescore) besides the eval summary: the rollouts to
score again, and what one scorer version has scored already."""

from __future__ import annotations

from rlbus.bus.store.reads.common import RUN, RUN_ENV

OF_VERSION = f"{RUN_ENV} AND scorer_version = {{version:String}}"
VERSION_SCORES = f"SELECT count() FROM scored FINAL WHERE {OF_VERSION}"
"""The run and environment's scores by one scorer version in the store: what a rescore waits on."""
RESCORED = f"SELECT DISTINCT rollout_id FROM scored WHERE {OF_VERSION}"
"""The rollouts that scorer version has scored already (a repeat skips them)."""
STORED = RUN_ENV
"""The run and environment's stored rollouts (`read_events` over `rollouts`), to which the
user's condition is added."""
GROUP_MEMBERS = f"{RUN} AND group_id IN {{groups:Array(String)}}"
"""Every stored rollout of the given groups (`read_events` over `rollouts`): what a group
reward scores whole."""
