"""What `rlbus replay sft` reads (rlbus.launch.replay_sft) besides the stored samples."""

from __future__ import annotations

STEPS = "SELECT count() FROM train_steps FINAL WHERE run_id = {run:String}"
"""A run's steps in the store: a replay refuses a run id that has some, then waits for its own."""

LANDED = (
    f"SELECT ({STEPS}) + (SELECT count() FROM weight_versions FINAL WHERE run_id = {{run:String}})"
)
"""What a replay published, counted in the store: its steps and its two weight versions (the
model it started from, the one it wrote), the last published after the last step."""
