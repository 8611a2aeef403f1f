"""The policy as torchtitan builds and parallelizes it (`trainer.parallel = "torchtitan"`).

For a model family torchtitan defines (Llama 3, which covers `LlamaForCausalLM` checkpoints such
as SmolLM2's), the model is torchtitan's own definition, built from the Hugging Face config on
the meta device; torchtitan's FSDP2 wrapping of a decoder shards it over the ranks (as its
`parallelize_llama` does with data parallelism alone: its tensor, context and pipeline
parallelism and compile are not applied) and, with `trainer.gradient_checkpointing`, its full
activation checkpointing wraps each block. The weights come from the same Hugging Face
directory through torchtitan's state-dict adapter and go back through it to Hugging Face names
for every published version, so inference loads the same files as from the other trainers.

Rows are right-padded and attention is causal, so a row's tokens never see its padding: the
decoder needs no attention mask, and positions start at 0 in every row as in transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

FAMILIES = ("llama",)
"""Hugging Face `model_type`s whose torchtitan definition this path builds."""

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass
class CausalLMOutput:
    logits: torch.Tensor


class TitanPolicy(nn.Module):
    """torchtitan's decoder behind the call the trainer's step makes:
    `model(input_ids=..., attention_mask=..., logits_to_keep=...).logits`."""

    def __init__(self, decoder: nn.Module, config: Any, adapter: Any):
        super().__init__()
        self.decoder = decoder
        self.config = config
        """The Hugging Face config it was built from (the memory estimate reads its sizes)."""
        self.adapter = adapter

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        logits_to_keep: torch.Tensor | None = None,
    ) -> CausalLMOutput:
        """`logits_to_keep`: a [B, T] bool mask; the logits of those positions alone, [n, V]
        row-major, as the Hugging Face models return them. The head still runs everywhere
        here: calling the decoder's parts one by one would skip FSDP2's unsharding of the
        root module's own parameters (embedding, norm, head)."""
        logits = self.decoder(input_ids)
        return CausalLMOutput(logits=logits if logits_to_keep is None else logits[logits_to_keep])

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """Every weight, gathered from the ranks, under its Hugging Face name (a tied head
        left out, as `save_pretrained` does): what a version publishes."""
        state = get_model_state_dict(self.decoder, options=FULL)
        return {k: v.contiguous() for k, v in self.adapter.to_hf(state).items()}


def require_torchtitan() -> None:
    """Say what to install when torchtitan is missing (it imports triton even on CPU)."""
    try:
        import torchtitan.models.llama3  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            f"trainer.parallel = 'torchtitan' needs torchtitan ({exc}): pip install "
            "'rlbus[gpu]', or torchtitan and triton"
        ) from exc


def decoder_config(hf: Any) -> Any:
    """torchtitan's Llama 3 config with the sizes of a Hugging Face Llama config. Every
    parameter's initializer is a no-op: the checkpoint's weights replace them all."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
    from torchtitan.models.common.param_init import skip_param_init
    from torchtitan.models.llama3 import Llama3Model, Llama3TransformerBlock

    if hf.model_type not in FAMILIES:
        raise ValueError(
            f"trainer.parallel = 'torchtitan' builds torchtitan's definitions of "
            f"{', '.join(FAMILIES)} models; this model is {hf.model_type!r}: use "
            "trainer.parallel = 'fsdp' (FSDP2 on the transformers model) instead"
        )
    rope = getattr(hf, "rope_parameters", None) or {"rope_theta": getattr(hf, "rope_theta", 1e4)}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(
            f"trainer.parallel = 'torchtitan': rope_type {rope['rope_type']!r} of this model is "
            "not converted (only the default rotary embedding is); use trainer.parallel = 'fsdp'"
        )
    skip = {"weight": skip_param_init, "bias": skip_param_init}
    dim, eps = hf.hidden_size, hf.rms_norm_eps
    head_dim = getattr(hf, "head_dim", None) or dim // hf.num_attention_heads

    def norm() -> Any:
        return RMSNorm.Config(normalized_shape=dim, eps=eps, param_init=skip)

    def block() -> Any:
        return Llama3TransformerBlock.Config(
            attention_norm=norm(),
            ffn_norm=norm(),
            attention=make_gqa_config(
                dim=dim,
                n_heads=hf.num_attention_heads,
                n_kv_heads=hf.num_key_value_heads,
                head_dim=head_dim,
                wqkv_param_init=skip,
                wo_param_init=skip,
                # Causal attention alone: a row holds one sequence, right-padded.
                inner_attention=ScaledDotProductAttention.Config(),
                rope=ComplexRoPE.Config(
                    dim=head_dim,
                    max_seq_len=hf.max_position_embeddings,
                    theta=rope.get("rope_theta", 10000.0),
                ),
            ),
            feed_forward=make_ffn_config(
                dim=dim, hidden_dim=hf.intermediate_size, w1_param_init=skip, w2w3_param_init=skip
            ),
        )

    return Llama3Model.Config(
        dim=dim,
        vocab_size=hf.vocab_size,
        enable_weight_tying=bool(hf.tie_word_embeddings),
        tok_embeddings=Embedding.Config(
            num_embeddings=hf.vocab_size, embedding_dim=dim, param_init=skip
        ),
        norm=norm(),
        lm_head=Linear.Config(in_features=dim, out_features=hf.vocab_size, param_init=skip),
        layers=[block() for _ in range(hf.num_hidden_layers)],
    )


def hf_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a Hugging Face directory's safetensors files."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} holds no *.safetensors weights for torchtitan to load")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    return state


def load_titan_policy(
    path: str | Path, world: int, device: str = "cpu", gradient_checkpointing: bool = False
) -> TitanPolicy:
    """The model of the Hugging Face directory `path` as torchtitan's decoder, sharded over the
    `world` ranks of the default process group (FSDP2 in fp32, as the other trainers), with
    the directory's weights."""
    require_torchtitan()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed.activation_checkpoint import FullAC
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
    from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(path)
    config = decoder_config(hf)
    with torch.device("meta"):
        decoder = config.build()
    # What torchtitan's parallelize_llama does with data parallelism alone, step by step: its
    # ParallelDims would build the mesh on "cuda" wherever no accelerator is found, so the
    # mesh here is torch's own, on the trainer's device type.
    if gradient_checkpointing:
        FullAC(FullAC.Config()).apply(decoder)
    mesh = init_device_mesh(torch.device(device).type, (world,), mesh_dim_names=("fsdp",))
    apply_fsdp_to_decoder(
        decoder, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False
    )
    # torchtitan turns FSDP's averaging of gradients over the ranks off (its own loop divides
    # by the global token count); the step here expects the average, as under trainer.parallel
    # = "fsdp". (Averaging is also the reduction gloo has: its sum with a factor is missing.)
    for module in decoder.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(float(world))
    decoder.to_empty(device=device)
    decoder.init_states(buffer_device=torch.device(device))  # the rotary tables
    adapter = Llama3StateDictAdapter(config, None)
    set_model_state_dict(decoder, adapter.from_hf(hf_state(path)), options=FULL)
    decoder.train()
    return TitanPolicy(decoder, hf, adapter)
