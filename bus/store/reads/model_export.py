"""What `rlbus model export` reads (rlbus.launch.model_export): a run's weight versions as the
sink stored its WeightVersion events, and the runs that have any."""

from __future__ import annotations

from rlbus.bus.store.reads.common import RUN

RUN_VERSIONS = f"""
SELECT version, argMax(uri, ts) AS uri, argMax(format, ts) AS format,
       argMax(num_params, ts) AS num_params
FROM weight_versions WHERE {RUN} GROUP BY version ORDER BY version
"""
"""One row per weight version of the run (a re-announced version: its newest event), oldest
first."""
RUNS_WITH_VERSIONS = (
    "SELECT run_id, max(ts) AS last FROM weight_versions GROUP BY run_id ORDER BY last DESC"
)
"""The runs with a weight version in the store, the latest first: what an unknown run's
error lists."""
