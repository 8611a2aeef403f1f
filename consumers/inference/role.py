"""The inference role (`rlbus worker inference`): serve a model (OpenAI chat completions,
token-in/token-out generate, score) and load every WeightVersion of the run as it is
published."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import ModuleType

from starlette.types import ASGIApp

from rlbus.bus.role import RoleSummary
from rlbus.bus.waiting import unless_stopped
from rlbus.config import Settings
from rlbus.config.runs import HFEngineConfig, VLLMConfig
from rlbus.consumers.inference.api import BackendKind, InferenceBackend
from rlbus.consumers.inference.serving import (
    advertised_url,
    default_worker_id,
    serve_following_weights,
    weights_group,
)
from rlbus.consumers.inference.sizing import check_serving_fits
from rlbus.consumers.model_size import LOADING


class InferenceRole:
    """Builds the engine for `model_path` and serves it on host:port, following the weights of
    `settings.run_id` (publishing WeightLoaded, with `url`) until `stop`. `threads` sets torch's
    intra-op threads: 1 suits tiny models on a shared small machine, where a second thread
    mostly waits for a core another process holds. `hf`, `vllm`: the built-in engine's and the
    vLLM backend's settings."""

    name = "inference"
    reads = ("weights",)
    writes = ("weights",)

    def __init__(
        self,
        settings: Settings,
        model_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        backend: BackendKind = "hf",
        device: str = "cpu",
        threads: int | None = None,
        worker_id: str | None = None,
        url: str | None = None,
        vllm: VLLMConfig | None = None,
        hf: HFEngineConfig | None = None,
        frozen: bool = False,
        adapters: dict[str, str] | None = None,
    ):
        self.settings = settings
        self.model_path = model_path
        self.host, self.port = host, port
        self.backend: BackendKind = backend
        self.device, self.threads = device, threads
        self.worker_id = worker_id or default_worker_id(port)
        self.url = url or advertised_url(host, port)
        self.vllm, self.hf = vllm, hf
        self.frozen = frozen
        self.adapters = adapters or {}
        """LoRA adapters it also scores with, {name: weights file URI} (served_adapters.py)."""

    def groups(self) -> list[str]:
        return [] if self.frozen else [weights_group(self.settings.run_id, self.worker_id)]

    def describe(self) -> str:
        following = (
            "its weights as loaded (frozen)"
            if self.frozen
            else f"following weights of run {self.settings.run_id!r}"
        )
        adapters = f", scoring with adapters {', '.join(self.adapters)}" if self.adapters else ""
        return (
            f"inference {Path(self.model_path).name} ({self.backend} on {self.device}) at "
            f"http://{self.host}:{self.port}/v1, {following}{adapters}"
        )

    async def run(self, stop: asyncio.Event) -> RoleSummary:
        # Importing torch and transformers takes seconds (many more under load), and loading the
        # model longer: both off the event loop, so that a stop (Ctrl-C, SIGTERM) ends the role
        # at once instead of after them.
        stopped = RoleSummary(self.name, "inference stopped while loading", finished=False)
        service = await unless_stopped(_serving_code, stop, "importing")
        if service is None:
            return stopped
        if self.threads:
            import torch  # imported with the serving code: at once

            torch.set_num_threads(self.threads)
        check_serving_fits(self.model_path, self.backend, self.device, self.vllm)

        def load() -> tuple[InferenceBackend, ASGIApp]:
            path, backend = self.model_path, self.backend
            with LOADING:
                engine = service.build_backend(
                    path,
                    backend,
                    device=self.device,
                    vllm=self.vllm,
                    hf=self.hf,
                    adapters=self.adapters,
                )
            return engine, service.build_app(engine, path)

        loaded = await unless_stopped(load, stop, "loading")
        if loaded is None:
            return stopped
        engine, app = loaded
        await serve_following_weights(
            self.settings,
            engine,
            app,
            self.host,
            self.port,
            stop,
            self.worker_id,
            self.url,
            follow=not self.frozen,
        )
        return RoleSummary(self.name, f"inference on {self.host}:{self.port} stopped")


def _serving_code() -> ModuleType:
    """The engines and the server (torch and transformers under them)."""
    from rlbus.consumers.inference import service

    return service
