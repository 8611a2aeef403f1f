"""One bad number never destroys a run (issue 14, finding 4, and the judge half of finding 9):
rewards must be finite, every reward runs under its timeout without blocking the others, and
the trainer never steps on a non-finite loss or gradient, nor on an empty batch."""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from rlbus.config.trainer import TrainerConfig
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.trainer.session import open_session
from rlbus.environment import Scorer, TaskSet, group_reward, load_environment, reward
from rlbus.schemas import RolloutCompleted, RolloutScored, TrainSample, masks
from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens


class Numbers(TaskSet):
    @reward
    def parsed(self, text: str) -> float:
        return float(text)


RELEASE_HOG = threading.Event()
HOG_RETURNED = threading.Event()


class Hog(TaskSet):
    @reward
    def quadratic(self, text: str) -> float:
        if text == "hog":
            # A synchronous reward that holds its thread (an O(n*m) diff) until the test lets it
            # go; the wait's own limit only keeps a judge that waits for it from hanging forever.
            RELEASE_HOG.wait(60)
            HOG_RETURNED.set()
        return 1.0


class GroupNaN(TaskSet):
    @group_reward
    def relative(self, texts: list[str]) -> list[float]:
        return [math.nan for _ in texts]


def rollouts(*texts: str) -> list[RolloutCompleted]:
    return [
        RolloutCompleted(
            rollout_id=f"r{i}",
            group_id="g",
            task_id="t",
            env="e",
            sample_index=i,
            group_size=len(texts),
            completion=[{"role": "assistant", "content": t}],
        )
        for i, t in enumerate(texts)
    ]


def score(cls: str, items: list[RolloutCompleted], **overrides: object) -> list[RolloutScored]:
    return asyncio.run(Scorer(load_environment(f"{__name__}:{cls}", dict(overrides))).score(items))


def test_a_non_finite_reward_is_an_error_with_its_name() -> None:
    ok, nan, inf = score("Numbers", rollouts("0.5", "nan", "-inf"))
    assert (ok.status, ok.reward) == ("ok", 0.5)
    assert nan.status == "error" and nan.error == "reward 'parsed' returned nan (not finite)"
    assert inf.status == "error" and "returned -inf" in inf.error
    assert nan.reward == 0.0 and math.isfinite(inf.reward)
    assert {s.status for s in score("GroupNaN", rollouts("a", "b"))} == {"error"}


def test_a_blocking_reward_times_out_without_holding_the_others() -> None:
    RELEASE_HOG.clear()
    HOG_RETURNED.clear()
    try:
        hog, fine = score("Hog", rollouts("hog", "fine"), reward_timeout_s=0.5)
        # The scores came back while the reward still held its thread: the judge did not wait.
        assert not HOG_RETURNED.is_set()
    finally:
        RELEASE_HOG.set()
    assert hog.status == "error" and hog.error == "reward 'quadratic' timed out after 0.5s"
    assert (fine.status, fine.reward) == ("ok", 1.0)
    assert HOG_RETURNED.wait(60)  # its thread was given up, not stopped: it ends once let go


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny"
    init_model(path, seed=0)
    return path


def sample(advantage: float) -> TrainSample:
    ids = list(range(3, 23))
    m = np.array([0] * 10 + [masks.POLICY] * 10, dtype=np.uint8)
    return TrainSample(
        rollout_id="r",
        input_ids=pack_tokens(ids),
        loss_mask=pack_mask(m),
        advantages=pack_logprobs((m > 0) * advantage),
        inference_logprobs=pack_logprobs(np.zeros(len(ids))),
    )


def weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


# A skipped first step advances the LR schedule on purpose: torch's warning of it is not shown.
@pytest.mark.filterwarnings("error::UserWarning")
def test_the_trainer_never_steps_on_a_non_finite_loss_nor_an_empty_batch(
    tiny: Path, tmp_path: Path
) -> None:
    session = open_session(TrainerConfig(), str(tiny), str(tmp_path / "ckpt"), 10, resume=False)
    trainer = session.trainer
    before = weights(trainer)
    poisoned = trainer.step([sample(1.0), sample(math.nan)], 0)
    assert poisoned.skipped == "non-finite loss or gradient"
    empty = trainer.step([], 0)
    assert empty.skipped == "empty batch"
    after = weights(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)  # not one weight moved
    good = trainer.step([sample(1.0)], 0)
    assert good.skipped == "" and math.isfinite(good.loss)
    moved = weights(trainer)
    assert any(not torch.equal(before[k], moved[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in moved.values())


@pytest.mark.parametrize(
    "bad", [[1.0, math.nan], [math.inf, 2.0], [-math.inf, math.inf]], ids=["nan", "inf", "+-inf"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_finite_weights_are_never_written(
    tmp_path: Path, bad: list[float], dtype: torch.dtype
) -> None:
    from rlbus.consumers.trainer.checkpoint import CheckpointStore, NonFiniteWeights

    store = CheckpointStore(str(tmp_path / "ckpt"))
    weights = {"layer.weight": torch.tensor(bad, dtype=dtype), "ok": torch.ones(2, dtype=dtype)}
    with pytest.raises(NonFiniteWeights, match="non-finite values in \\['layer.weight'\\]"):
        store.write_weights(1, weights)
    assert not store.has_weights(1)
    large = {"layer.weight": torch.full((1000,), 1e30, dtype=dtype)}  # finite, however large
    assert store.write_weights(2, large).bytes > 0


def test_a_weight_the_published_dtype_cannot_hold_is_never_written(tmp_path: Path) -> None:
    """float32 holds values past bfloat16's largest (3.39e38), which the cast to the published
    dtype makes infinite: on main such a version was checked before the cast, and written."""
    from rlbus.consumers.trainer.checkpoint import CheckpointStore, NonFiniteWeights

    store = CheckpointStore(str(tmp_path / "ckpt"), weights_dtype=torch.bfloat16)
    weights = {"layer.weight": torch.tensor([1.0, 3.4e38]), "ok": torch.ones(2)}
    with pytest.raises(NonFiniteWeights, match="non-finite values in \\['layer.weight'\\]"):
        store.write_weights(1, weights)
    assert not store.has_weights(1)
