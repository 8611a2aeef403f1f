"""The orchestrator: joins scored rollouts with their traces, turns each complete group into
training samples by its environment's algorithm, drops stale samples, packs TrainBatches and
paces task publication (bounded work in flight)."""
