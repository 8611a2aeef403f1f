"""Weights the trainer writes at real-model size: a tied model's embedding stored once and
loaded by inference, bf16 on the wire, the trainer state only every `checkpoint_every` steps
with batches held uncommitted until a saved state holds them, a LoRA state without the frozen
base it resumes onto."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from aiokafka.errors import KafkaError, RequestTimedOutError
from safetensors import safe_open

from rlbus.bus import Delivery
from rlbus.bus.commits import Holds
from rlbus.config.trainer import TrainerConfig
from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.trainer.batch_trainer import BatchTrainer
from rlbus.consumers.trainer.policy import full_weights
from rlbus.consumers.trainer.session import WrongBaseModel, open_session
from rlbus.schemas import TrainBatch, TrainSample, TrainStep, masks
from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tied"
    init_model(path, arch="qwen3", seed=0)  # qwen3 ties lm_head to the embedding
    return path


def batch(step: int) -> TrainBatch:
    ids = np.random.default_rng(step).integers(0, 255, 12)
    m = np.r_[np.zeros(4), np.full(8, masks.SUPERVISED)].astype(np.uint8)
    sample = TrainSample(
        rollout_id=f"r{step}",
        input_ids=pack_tokens(ids),
        loss_mask=pack_mask(m),
        advantages=pack_logprobs(m > 0),
        inference_logprobs=pack_logprobs(np.zeros(12)),
    )
    return TrainBatch(run_id="run", batch_id=f"b{step}", step=step, samples=[sample])


class RecordingBus:
    def __init__(self) -> None:
        self.events: list = []

    async def publish_many(self, events) -> None:
        self.events.extend(events)


class RefusingBus(RecordingBus):
    """A broker that does not take the first `refusals` publishes (a request that timed out
    before it reached the broker: aiokafka's RequestTimedOutError)."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals

    async def publish_many(self, events) -> None:
        if self.refusals:
            self.refusals -= 1
            raise RequestTimedOutError()
        await super().publish_many(events)


def worker_for(
    session, bus: RecordingBus, max_steps: int = 10, incarnation: str = ""
) -> BatchTrainer:
    return BatchTrainer(
        bus,
        session.trainer.step,
        session.checkpoints,
        session.state,
        session.hooks,
        "run",
        4,
        max_steps,
        asyncio.Event(),
        checkpoint_every=session.checkpoint_every,
        incarnation=incarnation,
    )


def stored(uri: str) -> dict[str, torch.dtype]:
    with safe_open(uri.removeprefix("file://"), "pt") as f:
        return {k: f.get_tensor(k).dtype for k in f.keys()}


async def logits_after_load(model_dir: Path, uri: str, ids: torch.Tensor) -> torch.Tensor:
    async with Engine.from_pretrained(model_dir) as engine:
        await engine.load_weights(uri, version=1)
        with torch.no_grad():
            return engine.model(input_ids=ids).logits


async def test_tied_model_trains_and_inference_serves_its_weights_stored_once(
    tied: Path, tmp_path: Path
) -> None:
    cfg = TrainerConfig(weights_dtype="float32", checkpoint_every=1)
    session = open_session(cfg, str(tied), str(tmp_path / "ckpt"), 10, resume=False)
    model = session.trainer.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    bus = RecordingBus()
    await worker_for(session, bus).handle([Delivery(batch(1), "batches", 0, 0)])
    uri = session.checkpoints.weights_uri(1)
    names = stored(uri)
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    ids = torch.tensor([[3, 50, 60, 70, 80]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    # Close, not equal: where the engine packs linear layers (packed_linear.py), it sums in
    # another order.
    torch.testing.assert_close(await logits_after_load(tied, uri, ids), expected)
    # Resume reads the state back and ties it the same way.
    resumed = open_session(cfg, str(tied), str(tmp_path / "ckpt"), 10, resume=True)
    again = resumed.trainer.model
    assert again.lm_head.weight is again.model.embed_tokens.weight
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)


async def test_lora_on_a_tied_model_publishes_merged_weights_once(
    tied: Path, tmp_path: Path
) -> None:
    cfg = TrainerConfig.model_validate({"weights_dtype": "float32", "lora": {"enabled": True}})
    session = open_session(cfg, str(tied), str(tmp_path / "ckpt"), 10, resume=False)
    await worker_for(session, RecordingBus()).handle([Delivery(batch(1), "batches", 0, 0)])
    uri = session.checkpoints.weights_uri(1)
    assert "lm_head.weight" not in stored(uri)
    ids = torch.tensor([[3, 50, 60, 70, 80]])
    with torch.no_grad():
        expected = session.trainer.model(input_ids=ids).logits
    torch.testing.assert_close(await logits_after_load(tied, uri, ids), expected)


def bytes_under(folder: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in folder.rglob(pattern) if p.is_file())


def assert_same_optimizer(got: dict, expected: dict) -> None:
    # a state loaded through torch.distributed.checkpoint gives AdamW its betas as a list
    groups = [{**g, "betas": tuple(g["betas"])} for g in got["param_groups"]]
    assert groups == expected["param_groups"]
    assert got["state"].keys() == expected["state"].keys()
    for i, state in expected["state"].items():
        for k, v in state.items():
            assert torch.equal(got["state"][i][k], v), (i, k)


LORA = TrainerConfig.model_validate(
    {"lora": {"enabled": True, "rank": 4, "target_modules": "q_proj,v_proj"}, "optim": {"lr": 1e-2}}
)
"""Adapters of ~1 % of this 128-wide model's weights, as rank 8 on every linear layer is of
SmolLM2-135M's (1.8 %); rank 8 on every layer of this model would be ~9 %."""


def test_a_lora_state_leaves_the_base_out_and_resumes_bit_for_bit(
    tied: Path, tmp_path: Path
) -> None:
    """A LoRA trainer's state holds the adapters and their optimizer state, not the frozen base
    (a resume loads it from `model` again): a fraction of the base's bytes. The resumed trainer
    has the same weights and optimizer state, and its next step is the one it would have taken
    without the stop."""
    ckpt = tmp_path / "ckpt"
    session = open_session(LORA, str(tied), str(ckpt), 10, resume=False)
    session.trainer.step(batch(1).samples)
    session.state.step = 1
    session.checkpoints.save(session.state, session.hooks.state())
    assert bytes_under(ckpt / "state") < 0.1 * bytes_under(tied, "*.safetensors")
    held = torch.load(ckpt / "state/step-000001/state.pt")["model"]
    trained = session.trainer.model.named_parameters()
    assert set(held) == {name for name, p in trained if p.requires_grad}  # no tied head either
    weights = full_weights(session.trainer.model)
    optimizer = copy.deepcopy(session.trainer.optimizer.state_dict())
    went_on = session.trainer.step(batch(2).samples)

    resumed = open_session(LORA, str(tied), str(ckpt), 10, resume=True)
    for name, tensor in full_weights(resumed.trainer.model).items():
        assert torch.equal(tensor, weights[name]), name
    assert_same_optimizer(resumed.trainer.optimizer.state_dict(), optimizer)
    assert resumed.trainer.step(batch(2).samples).loss == went_on.loss
    after = full_weights(session.trainer.model)
    for name, tensor in full_weights(resumed.trainer.model).items():
        assert torch.equal(tensor, after[name]), name


def test_a_lora_state_refuses_a_base_it_was_not_trained_on(tied: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    init_model(other, arch="qwen3", seed=1)  # same shapes and names, other weights
    ckpt = str(tmp_path / "ckpt")
    session = open_session(LORA, str(tied), ckpt, 10, resume=False)
    session.checkpoints.save(session.state, session.hooks.state())
    with pytest.raises(WrongBaseModel) as refused:
        open_session(LORA, str(other), ckpt, 10, resume=True)
    assert str(tied) in str(refused.value) and str(other) in str(refused.value)


async def test_weights_travel_in_bf16_and_the_step_reports_their_size(
    tied: Path, tmp_path: Path
) -> None:
    session = open_session(TrainerConfig(), str(tied), str(tmp_path / "ckpt"), 10, resume=False)
    bus = RecordingBus()
    await worker_for(session, bus).handle([Delivery(batch(1), "batches", 0, 0)])
    uri = session.checkpoints.weights_uri(1)
    assert set(stored(uri).values()) == {torch.bfloat16}
    model = session.trainer.model
    (step,) = [e for e in bus.events if isinstance(e, TrainStep)]
    size = Path(uri.removeprefix("file://")).stat().st_size
    assert step.metrics["weights_mb"] == pytest.approx(size / 1e6)
    assert step.metrics["weights_write_s"] > 0
    async with Engine.from_pretrained(tied) as engine:
        await engine.load_weights(uri, version=1)
        served = dict(engine.model.named_parameters())
        for name, param in model.named_parameters():
            assert served[name].dtype == torch.float32
            assert torch.equal(served[name], param.detach().to(torch.bfloat16).float()), name


async def test_state_saved_every_n_steps_and_batches_held_until_then(
    tied: Path, tmp_path: Path
) -> None:
    cfg = TrainerConfig(checkpoint_every=2)
    session = open_session(cfg, str(tied), str(tmp_path / "ckpt"), 3, resume=False)
    worker = worker_for(session, RecordingBus(), max_steps=3)
    holds = Holds()

    def delivery(step: int) -> Delivery:
        return Delivery(batch(step), "batches", 0, step - 1, holds=holds)

    await worker.handle([delivery(1)])
    assert session.checkpoints.has_weights(1) and session.checkpoints.latest_step() is None
    assert holds.offsets("batches", 0) == [0]  # not committable: no saved state holds it
    await worker.handle([delivery(2)])
    assert session.checkpoints.latest_step() == 2 and holds.offsets("batches", 0) == []
    await worker.handle([delivery(3)])  # the last step saves whatever the interval
    assert session.checkpoints.latest_step() == 3 and holds.offsets("batches", 0) == []


async def test_a_clean_stop_saves_the_state_of_the_steps_since_the_last(
    tied: Path, tmp_path: Path
) -> None:
    cfg = TrainerConfig(checkpoint_every=5)
    session = open_session(cfg, str(tied), str(tmp_path / "ckpt"), 10, resume=False)
    worker = worker_for(session, RecordingBus())
    holds = Holds()
    await worker.handle([Delivery(batch(1), "batches", 0, 0, holds=holds)])
    assert session.checkpoints.latest_step() is None
    await worker.save_state()
    assert session.checkpoints.latest_step() == 1 and holds.offsets("batches", 0) == []


async def test_a_step_whose_publish_the_broker_refused_is_published_when_handled_again(
    tied: Path, tmp_path: Path
) -> None:
    """The subscriber runs the handler again after a broker error (bus/unsent.py): the batch
    is trained already, so it is not trained again, and its step goes out then. On main only
    the weights version went out again, and the step's record was lost; when it was the last
    step, the trainer never stopped."""
    session = open_session(TrainerConfig(), str(tied), str(tmp_path / "ckpt"), 1, resume=False)
    bus = RefusingBus(refusals=1)
    worker = worker_for(session, bus, max_steps=1)
    delivery = Delivery(batch(1), "batches", 0, 0, holds=Holds())
    with pytest.raises(KafkaError):
        await worker.handle([delivery])
    assert not worker.stop.is_set()
    await worker.handle([delivery])
    assert session.state.step == 1 and worker.stop.is_set()  # trained once, and done
    steps = [e for e in bus.events if isinstance(e, TrainStep)]
    assert [s.step for s in steps] == [1]


async def test_a_resumed_trainer_retraining_a_step_publishes_it_as_another_attempt(
    tied: Path, tmp_path: Path
) -> None:
    """A trainer killed after step 3 resumes from the state of step 2 and trains step 3 again:
    another record (its timings differ), so another id. The store holds both attempts, lists
    no conflict, and the views count the step once (its newest attempt)."""
    from rlbus.bus.store import open_store

    cfg = TrainerConfig(checkpoint_every=2)
    ckpt = str(tmp_path / "ckpt")
    first = RecordingBus()
    session = open_session(cfg, str(tied), ckpt, 10, resume=False)
    worker = worker_for(session, first)
    for step in (1, 2, 3):
        await worker.handle([Delivery(batch(step), "batches", 0, step - 1, holds=Holds())])
    # killed here: step 3's batch was never committed, so it comes again to the resumed trainer
    resumed = open_session(cfg, str(tied), ckpt, 10, resume=True)
    assert resumed.state.step == 2 and resumed.incarnation and not session.incarnation
    again = RecordingBus()
    await worker_for(resumed, again, incarnation=resumed.incarnation).handle(
        [Delivery(batch(3), "batches", 0, 2, holds=Holds())]
    )
    steps = [e for e in first.events + again.events if isinstance(e, TrainStep)]
    assert [s.step for s in steps] == [1, 2, 3, 3]
    assert len({s.event_id for s in steps}) == 4
    with open_store(f"chdb://{tmp_path / 'store'}") as store:
        store.insert_events(steps, [(0, i) for i in range(len(steps))])
        assert store.query("SELECT count() FROM conflicts").rows == [(0,)]
        assert store.query("SELECT count() FROM train_steps FINAL").rows == [(4,)]
        for view in ("staleness", "throughput WHERE role = 'trainer'"):
            per_step = store.query(f"SELECT count() FROM {view} GROUP BY run_id").rows
            assert per_step == [(3,)], view


def test_replay_sft_fine_tunes_a_pretrained_model_at_a_small_rate() -> None:
    from rlbus.config.runs import ReplayConfig

    assert ReplayConfig().trainer.optim.lr <= 5e-5
    assert (
        ReplayConfig.model_validate({"trainer": {"optim": {"lr": 1e-3}}}).trainer.optim.lr == 1e-3
    )


def test_memory_estimate_refuses_what_cannot_fit_and_sizes_micro_batches(tied: Path) -> None:
    from rlbus.config.trainer import LoraConfig
    from rlbus.consumers.trainer.memory import (
        USABLE,
        NotEnoughMemory,
        estimate,
        micro_batch_tokens,
    )
    from rlbus.consumers.trainer.policy import load_policy

    model = load_policy(tied, LoraConfig())
    est = estimate(model, gradient_checkpointing=False)
    room = est.total(4096)
    with pytest.raises(NotEnoughMemory, match=r"lower trainer.micro_batch_tokens.*gradient_check"):
        micro_batch_tokens(est, 8192, "cpu", available=room)
    assert micro_batch_tokens(est, 4096, "cpu", available=room) == 4096  # honoured
    # Unset: the largest power of two whose estimate fits in USABLE of what is available.
    plenty = int(est.total(2048) / USABLE) + 1
    assert micro_batch_tokens(est, None, "cpu", available=plenty) == 2048
    checkpointed = estimate(model, gradient_checkpointing=True)
    assert micro_batch_tokens(checkpointed, None, "cpu", available=plenty) > 2048
    with pytest.raises(NotEnoughMemory, match="weights and optimizer state alone"):
        micro_batch_tokens(est, 256, "cpu", available=est.fixed_bytes // 2)


# transformers 5.24 renamed it; the old name warns and goes in v6, which `train` admits.
@pytest.mark.filterwarnings("error:.*gradient_checkpointing_enable:FutureWarning")
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(tied: Path) -> None:
    from rlbus.config.trainer import LoraConfig
    from rlbus.consumers.trainer.policy import load_policy
    from rlbus.consumers.trainer.step import Trainer

    runs = []
    for checkpointing in (False, True):
        model = load_policy(tied, LoraConfig(), gradient_checkpointing=checkpointing)
        assert model.is_gradient_checkpointing == checkpointing
        cfg = TrainerConfig(micro_batch_tokens=64, gradient_checkpointing=checkpointing)
        result = Trainer(model, cfg, total_steps=1).step(batch(1).samples + batch(2).samples)
        # The step zeroes its gradients: their norm and the weights AdamW made of them remain.
        runs.append((result.loss, result.grad_norm, dict(model.named_parameters())))
    (loss, norm, plain), (loss_ckpt, norm_ckpt, ckpt) = runs
    assert loss == pytest.approx(loss_ckpt, rel=1e-6)
    assert norm == pytest.approx(norm_ckpt, rel=1e-5)
    for name, weight in plain.items():
        torch.testing.assert_close(ckpt[name], weight, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("where", ["file", "memory"])
def test_weights_stream_to_local_and_remote_folders_and_read_back_whole(
    where: str, tmp_path: Path
) -> None:
    """A version is serialized straight into its file (locally, or locally then uploaded to a
    remote fsspec folder), renamed into place whole, and read back tensor for tensor."""
    from rlbus.consumers.inference.checkpoint_reader import read_checkpoint
    from rlbus.consumers.trainer.checkpoint import CheckpointStore

    url = f"file://{tmp_path}/ckpt" if where == "file" else f"memory://ckpt-{tmp_path.name}"
    store = CheckpointStore(url, keep_weights=2, weights_dtype=torch.bfloat16)
    weights = {"a.weight": torch.randn(64, 32), "b.bias": torch.randn(7), "step": torch.tensor(3)}
    for version in (1, 2, 3):
        written = store.write_weights(version, weights)
        fs = store.folder.fs
        path = store.folder.path(f"weights/v{version:06d}.safetensors")
        assert written.bytes == fs.size(path) > 0
    listed = fs.ls(store.folder.path("weights"), detail=False)
    assert sorted(p.rsplit("/", 1)[-1] for p in listed) == [
        "v000002.safetensors",
        "v000003.safetensors",
    ]  # pruned to keep_weights; no temporary file left behind
    back = read_checkpoint(written.uri)
    assert back.kind == "full" and set(back.tensors) == set(weights)
    assert back.tensors["a.weight"].dtype == torch.bfloat16
    assert torch.equal(back.tensors["a.weight"], weights["a.weight"].to(torch.bfloat16))
    assert torch.equal(back.tensors["step"], weights["step"])
