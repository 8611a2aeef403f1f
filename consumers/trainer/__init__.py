"""The trainer: turns TrainBatches into new weights. It sees token ids, a loss mask, per-token
advantages and inference log-probs, never the algorithm that produced them.

Submodules are imported by what they do (`losses`, `engine`, `worker`, ...); importing this
package loads no torch, so the orchestrator can use `staleness` and `masks` cheaply.
"""
