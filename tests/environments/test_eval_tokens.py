"""An eval against rlbus's own inference server records what it serves (token ids, log-probs,
the policy version) with no flags: the server is recognised by its policy-version header. Any
other endpoint is asked for nothing beyond OpenAI's own fields. Real inference server on a tiny
model, real broker, a sink holding real chdb (test_eval's module store)."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import numpy as np
from safetensors.torch import save_file
from support import ScriptedServer
from test_eval import EXAMPLES, settings, upstream  # noqa: F401  (module fixtures)

from rlbus.bus.server_thread import ServerThread
from rlbus.bus.store import open_store
from rlbus.clients.chat_client import POLICY_VERSION_HEADER
from rlbus.config import Settings
from rlbus.consumers.inference import server as inference_server
from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.service import build_app, build_backend
from rlbus.environment import ModelConfig, load_environment
from rlbus.launch.eval import run_eval
from rlbus.producers.interception import EvalBackend, InterceptionServer
from rlbus.schemas import UNKNOWN_POLICY_VERSION, RolloutCompleted, TokenRecord, TraceNode
from rlbus.schemas.packed import logprobs, mask, tokens
from rlbus.schemas.samples import trace_samples


def test_the_header_is_the_one_the_inference_server_sends() -> None:
    assert POLICY_VERSION_HEADER == inference_server.VERSION_HEADER


def test_eval_against_rlbus_inference_records_ids_logprobs_and_version(
    settings: Settings,  # noqa: F811
    tmp_path: Path,
) -> None:
    model_dir = tmp_path / "tiny"
    init_model(model_dir)
    backend = build_backend(model_dir)
    assert isinstance(backend, Engine)
    weights = tmp_path / "v3.safetensors"
    save_file({n: p.detach().clone() for n, p in backend.model.named_parameters()}, str(weights))
    app = build_app(backend, model_dir, model_name="tiny", renderer="template")
    with ServerThread(app, lifespan="on") as engine:
        loaded = httpx.post(
            f"{engine.url}/v1/weights", json={"uri": str(weights), "version": 3}, timeout=60
        )
        assert loaded.status_code == 200, loaded.text
        env = load_environment(
            str(EXAMPLES / "reverse_text"),
            {
                "group_size": 2,
                "sampling": {"max_tokens": 5},
                "model": {"name": "tiny", "base_url": f"{engine.url}/v1"},
            },
        )
        assert env.config.model.mode == "eval"
        result = run_eval(
            env, settings, n=3, run_id=f"tokens-{uuid.uuid4().hex[:8]}", show_progress=False
        )
    assert (result.tally.rollouts, result.tally.errors) == (6, 0)
    with open_store(settings.store.url, read_only=True) as store:
        where, params = "run_id = {run:String}", {"run": result.run_id}
        records = store.read_events(TokenRecord, where, parameters=params)
        nodes = store.read_events(TraceNode, where, parameters=params)
        rollouts = store.read_events(RolloutCompleted, where, parameters=params)
    assert len(records) == 6 and len(rollouts) == 6
    for record in records:
        completion = tokens(record.completion_ids)
        assert len(tokens(record.prompt_ids)) > 0 and 0 < len(completion) <= 5
        assert len(logprobs(record.logprobs)) == len(completion)
        assert np.all(logprobs(record.logprobs) <= 0) and record.policy_version == 3
    assert {(r.min_policy_version, r.max_policy_version) for r in rollouts} == {(3, 3)}
    # The stored trace is trainable as it is: one sample per rollout, loss on what was sampled.
    for rollout in rollouts:
        own = [n for n in nodes if n.rollout_id == rollout.rollout_id]
        (record,) = [r for r in records if r.rollout_id == rollout.rollout_id]
        (sample,) = trace_samples(own, [record])
        assert list(tokens(sample.input_ids)) == list(tokens(record.prompt_ids)) + list(
            tokens(record.completion_ids)
        )
        assert int(mask(sample.loss_mask).sum()) == len(tokens(record.completion_ids))


async def test_other_endpoints_are_asked_for_openai_fields_only(
    upstream: ScriptedServer,  # noqa: F811
) -> None:
    upstream.model.calls.clear()
    backend = EvalBackend(ModelConfig(name="scripted", base_url=f"{upstream.url}/v1"))
    async with InterceptionServer(backend) as server:
        with server.session("r-plain") as session:
            result = await session.chat([{"role": "user", "content": "reverse abc"}])
    assert result.message["content"] == "cba"
    (body,) = upstream.model.calls
    assert "return_token_ids" not in body and "logprobs" not in body
    _, (record,) = session.trace.events("g")
    # The endpoint does not say which weights sampled: unknown, not version 0.
    assert (record.prompt_ids, record.completion_ids, record.policy_version) == (
        b"",
        b"",
        UNKNOWN_POLICY_VERSION,
    )
