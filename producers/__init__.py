"""Env producers (docs/architecture.md: Roles): task sets and environments, harnesses, runtimes, the
interception server, and running, evaluating and publishing rollouts."""
