"""The trainer: turns TrainBatches into new weights. It sees token ids, a loss mask, per-token
advantages and inference log-probs, never the algorithm that produced them.

`role.py` is its door (FSDP's ranks included); `batch_trainer.py` trains each batch exactly once on
an at-least-once bus; `session.py` opens the model, optimizer and checkpoints; `step.py` is one
optimizer step (`policy.py`, `losses.py`, `batching.py`, `memory.py` its parts); `checkpoint.py`
writes states and weight versions; `fsdp.py`, `titan.py` and `distributed.py` shard it; `sft.py`
is `rlbus replay sft`'s trainer. Importing this package loads no torch.
"""
