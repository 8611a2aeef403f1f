"""Trainer core on CPU: packing, staleness, one optimizer step on a tiny model, LoRA export,
checkpoints and the resume rule."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rlbus.config.trainer import LoraConfig, OptimConfig, TrainerConfig
from rlbus.consumers.inference.checkpoint_reader import CheckpointError
from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.weights import WeightFollower
from rlbus.consumers.trainer.batch_trainer import step_line
from rlbus.consumers.trainer.batching import collate, pack
from rlbus.consumers.trainer.checkpoint import CheckpointStore, NothingToResume
from rlbus.consumers.trainer.policy import full_weights, load_policy, token_logprobs
from rlbus.consumers.trainer.session import CheckpointExists, open_session
from rlbus.consumers.trainer.step import StepResult, Trainer, lr_factor
from rlbus.schemas import TrainSample, WeightVersion, masks
from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens
from rlbus.schemas.staleness import filter_stale


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny"
    init_model(path, seed=0)
    return path


def sample(
    ids: list[int],
    sampled_from: int,
    code: int = masks.POLICY,
    advantage: float = 1.0,
    lps: list[float] | None = None,
    version: int = 0,
    rollout: str = "r",
) -> TrainSample:
    n = len(ids)
    m = np.array([0] * sampled_from + [code] * (n - sampled_from), dtype=np.uint8)
    return TrainSample(
        rollout_id=rollout,
        input_ids=pack_tokens(ids),
        loss_mask=pack_mask(m),
        advantages=pack_logprobs((m > 0) * advantage),
        inference_logprobs=pack_logprobs(lps if lps is not None else [0.0] * n),
        policy_version=version,
    )


def test_pack_bounds_padded_tokens_and_keeps_every_sample() -> None:
    lengths = [10, 3, 7, 7, 2, 12]
    groups = pack(lengths, budget_tokens=16)
    assert sorted(i for g in groups for i in g) == list(range(6))
    for g in groups:
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= 16
    assert groups[0] == [5]  # 12 alone; longest first
    assert pack([40], 16) == [[0]]  # an over-long sample still gets trained alone


def test_staleness_drops_and_counts() -> None:
    samples = [sample([1, 2, 3], 1, version=v, rollout=f"r{v}") for v in (5, 4, 3, 2, 0)]
    out = filter_stale(samples, policy_version=5, max_off_policy_steps=2)
    assert [s.rollout_id for s in out.kept] == ["r5", "r4", "r3"]
    assert out.dropped == 2
    assert out.histogram == {"0": 1, "1": 1, "2": 1, "3": 1, "5": 1}


def test_collate_refuses_misaligned_samples() -> None:
    bad = TrainSample(
        rollout_id="x",
        input_ids=pack_tokens([1, 2, 3]),
        loss_mask=pack_mask([0, 1]),
        advantages=pack_logprobs([0, 1, 1]),
        inference_logprobs=pack_logprobs([0, 0, 0]),
    )
    with pytest.raises(ValueError, match="rollout x: 3 input ids"):
        collate([bad])


def test_step_line_says_why_a_step_has_no_kl() -> None:
    """A batch with no sample of the version being trained has no mismatch KL: the log line says
    so and shows the older samples' KL instead of printing `nan`."""
    old_only = StepResult(
        loss=0.5,
        grad_norm=1.0,
        entropy=0.1,
        mismatch_kl=math.nan,
        lr=1e-5,
        num_samples=4,
        num_tokens=10,
        input_tokens=20,
        seconds=0.3,
        metrics={"off_policy_kl": 0.002},
    )
    line = step_line(7, old_only)
    assert "nan" not in line
    assert "kl - (no sample of this version; off-policy 2.00e-03)" in line
    fresh = step_line(7, dataclasses.replace(old_only, mismatch_kl=1e-4))
    assert "step 7: loss 0.5000 grad norm 1.000 kl 1.00e-04 (4 samples, 0.30s)" == fresh


def test_lr_schedule() -> None:
    cfg = OptimConfig(warmup_steps=3, schedule="linear", min_lr_ratio=0.1)
    assert [round(lr_factor(s, cfg, 13), 3) for s in (0, 2, 3, 8, 13)] == [
        0.25,
        0.75,
        1.0,
        0.55,
        0.1,
    ]
    assert lr_factor(100, OptimConfig(), 10) == 1.0


@pytest.mark.slow
def test_sft_steps_learn_and_inference_logprobs_match(tiny: Path) -> None:
    torch.manual_seed(0)
    model = load_policy(tiny, LoraConfig())
    trainer = Trainer(
        model, TrainerConfig(optim=OptimConfig(lr=3e-3), micro_batch_tokens=32), total_steps=20
    )
    seqs = [[10, 11, 12, 13, 14, 15, 16, 17], [20, 21, 22, 23, 24], [30, 31, 32, 33, 34, 35]]
    batch = [sample(s, 2, code=masks.SUPERVISED) for s in seqs]
    losses = [trainer.step(batch).loss for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0]
    # Inference log-probs computed by the very same weights: the mismatch KL is ~0.
    mb = collate([sample(seqs[0], 2)])
    with torch.no_grad():
        lps, _ = token_logprobs(model, mb)
    rl = [sample(seqs[0], 2, advantage=0.5, lps=lps[0].tolist())]
    result = trainer.step(rl, version=0)
    assert result.mismatch_kl == pytest.approx(0.0, abs=1e-6)
    assert result.num_tokens == 6 and result.grad_norm > 0


def test_token_logprobs_run_the_head_only_where_a_loss_token_is_predicted(tiny: Path) -> None:
    """The log-probs and entropies at loss positions equal those of the whole sequence's
    logits, gradients included, while the head sees only the positions before loss tokens."""
    torch.manual_seed(0)
    model = load_policy(tiny, LoraConfig())
    seqs = [[10, 11, 12, 13, 14, 15, 16, 17], [20, 21, 22, 23, 24], [30, 31, 32, 33, 34, 35]]
    mb = collate([sample(s, start) for s, start in zip(seqs, (5, 2, 3), strict=True)])
    mb.temperature = torch.tensor([1.0, 0.7, 1.3])
    seen: list[int] = []
    hook = model.lm_head.register_forward_hook(
        lambda _m, args, _out: seen.append(args[0].reshape(-1, args[0].shape[-1]).shape[0])
    )
    lps, entropy = token_logprobs(model, mb)
    hook.remove()
    scored = mb.loss_mask > 0
    assert seen == [int(scored.sum())]  # 3 + 3 + 3 loss tokens, not 3 x 8 positions

    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1]
    dist = torch.log_softmax(logits / mb.temperature[:, None, None], dim=-1)
    full = dist.gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1)
    expected = torch.cat([torch.zeros(3, 1), full], dim=1)
    assert torch.allclose(lps[scored], expected[scored], atol=1e-6)
    assert torch.all(lps[~scored] == 0)
    at_loss = dist[scored[:, 1:]]
    assert torch.allclose(entropy, -(at_loss.exp() * at_loss).sum(-1), atol=1e-5)
    (grad,) = torch.autograd.grad(lps[scored].sum(), model.lm_head.weight)
    (expected_grad,) = torch.autograd.grad(expected[scored].sum(), model.lm_head.weight)
    assert torch.allclose(grad, expected_grad, atol=1e-6)


def test_lora_exports_merged_weights_under_base_names(tiny: Path) -> None:
    base = load_policy(tiny, LoraConfig())
    lora = load_policy(tiny, LoraConfig(enabled=True, rank=4))
    trainer = Trainer(lora, TrainerConfig(optim=OptimConfig(lr=1e-2)), total_steps=5)
    trainer.step([sample([5, 6, 7, 8, 9], 1, code=masks.SUPERVISED)])
    merged = full_weights(lora)
    assert set(merged) == set(base.state_dict())
    changed = [k for k in merged if not torch.equal(merged[k], base.state_dict()[k])]
    assert changed and all("proj" in k for k in changed)
    assert not any("lora" in n for n, _ in lora.named_parameters() if not _.requires_grad)


async def test_lora_versions_carry_adapters_alone_and_serve_the_merged_weights(
    tiny: Path, tmp_path: Path
) -> None:
    """With LoRA, a version's file holds the adapters' deltas (a fraction of the model); the
    engine merges each onto the base it started from, so it serves exactly what the trainer's
    merged weights are, version after version (never a delta stacked on the previous one)."""
    lora = LoraConfig(enabled=True, rank=4, target_modules="q_proj,v_proj")
    cfg = TrainerConfig(lora=lora, optim=OptimConfig(lr=1e-2), weights_dtype="float32")
    s = open_session(cfg, str(tiny), f"file://{tmp_path}/ckpt", 10, resume=False)
    assert s.checkpoints.weights_format == "safetensors-lora"
    merged_store = CheckpointStore(f"file://{tmp_path}/merged")
    full_bytes = merged_store.write_weights(0, full_weights(s.trainer.model)).bytes
    async with Engine.from_pretrained(tiny) as engine:
        params = dict(engine.model.named_parameters())
        untouched = params["model.embed_tokens.weight"].detach().clone()
        for version in (1, 2):
            s.trainer.step([sample([5, 6, 7, 8, 9], 1, code=masks.SUPERVISED)])
            written = s.checkpoints.write_weights(version, s.hooks.weights())
            assert written.bytes < 0.2 * full_bytes
            await engine.load_weights(written.uri, version)
            expected = full_weights(s.trainer.model)
            for name, tensor in expected.items():
                assert torch.allclose(params[name], tensor, atol=1e-6), (version, name)
        assert torch.equal(params["model.embed_tokens.weight"], untouched)
        event = WeightVersion(
            run_id="r", version=3, uri=written.uri, format=s.checkpoints.weights_format
        )
        served = await WeightFollower(engine, "w").on_weight_version(event)
        assert served is not None and engine.policy_version == 3

        q_proj = "model.layers.0.self_attn.q_proj"
        wrong = {q_proj + ".lora_A": torch.zeros(4, 3), q_proj + ".lora_B": torch.zeros(4, 4)}
        bad = CheckpointStore(f"file://{tmp_path}/bad", weights_kind="lora-delta")
        with pytest.raises(CheckpointError, match="q_proj: lora_B .* does not make its weight"):
            await engine.load_weights(bad.write_weights(4, wrong).uri, 4)
        # Full weights served once, a delta has no base left to merge onto.
        await engine.load_weights(merged_store.write_weights(5, expected).uri, 5)
        with pytest.raises(CheckpointError, match="serves full weights of version 5"):
            await engine.load_weights(s.checkpoints.write_weights(6, s.hooks.weights()).uri, 6)


def test_checkpoint_resume_rules_and_round_trip(tiny: Path, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ckpt"
    cfg = TrainerConfig()
    with pytest.raises(NothingToResume):
        open_session(cfg, str(tiny), url, 10, resume=True)
    s = open_session(cfg, str(tiny), url, 10, resume=False)
    s.trainer.step([sample([1, 2, 3, 4], 1, code=masks.SUPERVISED)])
    s.state.step, s.state.batch_ids = 1, ["b1"]
    s.checkpoints.save(s.state, s.hooks.state())
    s.checkpoints.write_weights(1, s.hooks.weights())
    with pytest.raises(CheckpointExists, match="step 1"):
        open_session(cfg, str(tiny), url, 10, resume=False)
    r = open_session(cfg, str(tiny), url, 10, resume=True)
    assert r.state.step == 1 and r.state.batch_ids == ["b1"]
    for k, v in s.hooks.weights().items():
        assert torch.equal(v, r.hooks.weights()[k])
    assert (
        r.trainer.optimizer.state_dict()["state"].keys()
        == s.trainer.optimizer.state_dict()["state"].keys()
    )
    assert r.checkpoints.has_weights(1)


def test_a_trainer_resumed_behind_its_newest_weights_keeps_what_it_writes(tmp_path: Path) -> None:
    """Every process of a run killed at step 46, state saved at 40, three weight files kept
    (44-46): the resumed trainer writes version 40 again, then 41, ... On main each was pruned
    as it was written (the three newest by number were the dead run's 44-46), so inference could
    load none of them and the resumed run waited for ever. Versions past the one written are the
    dead run's: they are trained again, and their files go."""
    store = CheckpointStore(f"file://{tmp_path}/ckpt", keep_weights=3)
    weights = {"w": torch.ones(2)}
    for version in range(38, 47):
        store.write_weights(version, weights)
    for version in (40, 41):  # the resumed trainer's announcement, then its next step
        store.write_weights(version, weights)
        assert store.has_weights(version)
    assert [v for v in range(38, 47) if store.has_weights(v)] == [40, 41]


class RecordingBus:
    def __init__(self) -> None:
        self.events: list = []

    async def publish(self, event) -> None:
        self.events.append(event)

    async def publish_many(self, events) -> None:
        self.events.extend(events)


async def test_trainer_worker_never_trains_stale_samples_counts_them_and_skips_retrained_batches(
    tiny: Path, tmp_path: Path
) -> None:
    import asyncio

    from rlbus.bus import Delivery
    from rlbus.consumers.trainer.batch_trainer import BatchTrainer
    from rlbus.schemas import TrainBatch, TrainStep, WeightVersion

    session = open_session(TrainerConfig(), str(tiny), str(tmp_path / "ckpt"), 10, resume=False)
    session.state.step = 5  # training version 5, bound 2: versions 3..5 are fresh
    seen: list[list[int]] = []

    def step(samples, version):
        seen.append([s.policy_version for s in samples])
        return session.trainer.step(samples, version)

    bus = RecordingBus()
    worker = BatchTrainer(
        bus, step, session.checkpoints, session.state, session.hooks, "run", 2, 10, asyncio.Event()
    )
    samples = [sample([1, 2, 3, 4], 1, version=v, rollout=f"v{v}") for v in (5, 4, 3, 2, 1)]
    batch = TrainBatch(
        run_id="run", batch_id="b6", step=6, samples=samples, dropped_stale=3
    )  # 3 by the orchestrator
    await worker.handle([Delivery(batch, "batches", 0, 0)])
    await worker.handle([Delivery(batch, "batches", 0, 0)])  # redelivered: not trained again
    assert seen == [[5, 4, 3]]
    (train_step,) = [e for e in bus.events if isinstance(e, TrainStep)]
    assert train_step.dropped_stale == 3 + 2 and train_step.staleness == {
        "0": 1,
        "1": 1,
        "2": 1,
        "3": 1,
        "4": 1,
    }
    versions = [e for e in bus.events if isinstance(e, WeightVersion)]
    assert [v.version for v in versions] == [6, 6] and versions[0].event_id == versions[1].event_id
    assert session.checkpoints.latest_step() == 6
