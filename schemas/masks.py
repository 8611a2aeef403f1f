"""What a loss-mask value means. The mask is uint8, so one sample can mix token kinds:
RL on the policy's actions and cross-entropy on the environment's tokens (echo), or plain
supervised tokens (sft) next to RL samples in one batch."""

from __future__ import annotations

IGNORE = 0
"""Context: no loss."""
POLICY = 1
"""Sampled by the policy: trained by the batch's loss, weighted by the token's advantage."""
SUPERVISED = 2
"""Imitated: cross-entropy whatever the batch's loss, weighted by the token's advantage."""
