"""The built-in algorithms (grpo, sft, echo, opd, self-distill), registered through the
environment layer's hook (`rlbus.environment.algorithm`), and the registry's lookup."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from rlbus.config.orchestrator import AlgorithmConfig
from rlbus.environment.algorithm import (
    ALGORITHMS,
    Algorithm,
    Context,
    GroupMember,
    TokenScorer,
    algorithm,
)
from rlbus.schemas import TrainSample, masks
from rlbus.schemas.packed import logprobs, mask, pack_logprobs, pack_mask, tokens


def make_algorithm(cfg: AlgorithmConfig, ctx: Context | None = None) -> Algorithm:
    if cfg.name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm {cfg.name!r}; registered: {sorted(ALGORITHMS)}")
    return ALGORITHMS[cfg.name](cfg, ctx or Context())


def group_advantages(
    rewards: Sequence[float], lengths: Sequence[int], cfg: AlgorithmConfig
) -> np.ndarray:
    """Reward minus the group mean (after optional length shaping), optionally over the std."""
    r = np.asarray(rewards, dtype=np.float64)
    if not len(r):  # no member to train on (every one errored): nothing to center
        return r
    if cfg.length_penalty and len(lengths):
        longest = max(1, max(lengths))
        r = r - cfg.length_penalty * np.asarray(lengths, dtype=np.float64) / longest
    adv = r - r.mean()
    if cfg.normalize_std:
        adv = adv / (r.std() + 1e-6)
    return adv


def with_tokens(
    sample: TrainSample, codes: np.ndarray, advantages: np.ndarray, **changes: object
) -> TrainSample:
    return msgspec.structs.replace(
        sample, loss_mask=pack_mask(codes), advantages=pack_logprobs(advantages), **changes
    )


def _ok(group: Sequence[GroupMember]) -> list[GroupMember]:
    return [s for s in group if s.scored.status == "ok" and s.samples]


@algorithm("grpo")
class GRPO(Algorithm):
    """Group-relative: every sampled token of a rollout gets its reward minus the group mean."""

    async def samples(self, group: Sequence[GroupMember]) -> list[TrainSample]:
        ok = _ok(group)
        adv = group_advantages(
            [s.scored.reward for s in ok], [s.scored.completion_tokens for s in ok], self.cfg
        )
        out = []
        for member, a in zip(ok, adv, strict=True):
            for sample in member.samples:
                sampled = mask(sample.loss_mask) > 0
                out.append(
                    with_tokens(
                        sample,
                        sampled.astype(np.uint8) * masks.POLICY,
                        sampled.astype(np.float32) * np.float32(a),
                    )
                )
        return out


@algorithm("sft")
class SFT(Algorithm):
    """Imitate the sampled tokens (a teacher's rollouts, or replayed ones): cross-entropy, weight
    1."""

    async def samples(self, group: Sequence[GroupMember]) -> list[TrainSample]:
        out = []
        for member in _ok(group):
            for sample in member.samples:
                sampled = mask(sample.loss_mask) > 0
                out.append(
                    with_tokens(
                        sample,
                        sampled.astype(np.uint8) * masks.SUPERVISED,
                        sampled.astype(np.float32),
                    )
                )
        return out


@algorithm("echo")
class Echo(Algorithm):
    """GRPO on the policy's tokens plus cross-entropy on the environment's tokens that follow
    the first sampled one (tool results, user turns): the model also learns to predict the world."""

    async def samples(self, group: Sequence[GroupMember]) -> list[TrainSample]:
        out = []
        for sample in await GRPO(self.cfg, self.ctx).samples(group):
            codes = mask(sample.loss_mask).copy()
            adv = logprobs(sample.advantages).copy()
            sampled = np.flatnonzero(codes == masks.POLICY)
            if len(sampled):
                world = np.zeros(len(codes), dtype=bool)
                world[sampled[0] :] = codes[sampled[0] :] == masks.IGNORE
                codes[world] = masks.SUPERVISED
                adv[world] = self.cfg.echo_weight
            out.append(with_tokens(sample, codes, adv))
        return out


async def _teacher_logprobs(
    scorer: TokenScorer, sample: TrainSample, prefix: list[int]
) -> np.ndarray:
    """Teacher log-probs aligned with the sample's ids (0 before the first sampled token)."""
    ids = tokens(sample.input_ids)
    sampled = np.flatnonzero(mask(sample.loss_mask))
    out = np.zeros(len(ids), dtype=np.float32)
    if not len(sampled):
        return out
    start = int(sampled[0])
    scored = await scorer.score(
        [*prefix, *ids[:start].tolist()], ids[start:].tolist(), sample.temperature or 1.0
    )
    out[start:] = scored
    return out


class _Distill(Algorithm):
    """Per-token advantage = teacher log-prob - policy (inference) log-prob on sampled tokens."""

    def prefix(self, member: GroupMember) -> list[int]:
        return []

    def scorer(self) -> TokenScorer:
        if self.ctx.teacher is None:
            raise ValueError(f"algorithm {self.cfg.name!r} needs a teacher: set teacher_url")
        return self.ctx.teacher

    async def samples(self, group: Sequence[GroupMember]) -> list[TrainSample]:
        scorer = self.scorer()
        out = []
        for member in _ok(group):
            for sample in member.samples:
                teacher = await _teacher_logprobs(scorer, sample, self.prefix(member))
                sampled = mask(sample.loss_mask) > 0
                adv = np.where(sampled, teacher - logprobs(sample.inference_logprobs), 0).astype(
                    np.float32
                )
                out.append(
                    with_tokens(
                        sample,
                        sampled.astype(np.uint8) * masks.POLICY,
                        adv,
                        teacher_logprobs=pack_logprobs(teacher),
                    )
                )
        return out


@algorithm("opd")
class OnPolicyDistillation(_Distill):
    """On-policy distillation: the teacher model scores the policy's own samples."""


@algorithm("self-distill")
class SelfDistill(_Distill):
    """The policy is its own teacher, shown a hint (e.g. the answer) before the context."""

    def prefix(self, member: GroupMember) -> list[int]:
        if self.ctx.encode is None:
            raise ValueError(
                "algorithm 'self-distill' needs the policy's tokenizer to encode its hint"
            )
        return self.ctx.encode(self.cfg.hint.format(answer=member.rollout.answer))


def teacher_kl(samples: Sequence[tuple[TrainSample, str]]) -> dict[str, float]:
    """`teacher_kl.ENV`: per environment, the mean over the tokens the policy sampled of its
    log-prob minus its teacher's (KL(policy || teacher) estimated on the policy's samples), for
    the samples a teacher scored. A batch's metrics carry it, so that each teacher's distance is
    a curve over steps (`SELECT step, metrics['teacher_kl.ENV'] FROM batches`)."""
    sums: dict[str, list[float]] = {}
    for sample, env in samples:
        if not sample.teacher_logprobs:
            continue
        sampled = mask(sample.loss_mask) > 0
        gap = logprobs(sample.inference_logprobs) - logprobs(sample.teacher_logprobs)
        total = sums.setdefault(env, [0.0, 0.0])
        total[0] += float(gap[sampled].sum())
        total[1] += float(sampled.sum())
    return {f"teacher_kl.{env}": s / n for env, (s, n) in sums.items() if n}
