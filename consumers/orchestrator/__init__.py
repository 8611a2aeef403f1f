"""The orchestrator: joins scored rollouts with their traces, turns each complete group into
training samples by its environment's algorithm, drops stale samples, packs TrainBatches and
paces task publication (bounded work in flight). `role.py` is its door; `orchestration.py` wires
the parts named in its docstring; `build.py` makes one from a run config."""
