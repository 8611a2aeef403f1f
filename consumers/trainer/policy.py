"""The policy model: a transformers causal LM, optionally with LoRA adapters, and the one
forward pass the losses need (per-token log-probs of the given ids, tempered, plus entropy)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard, TypeVar, cast

import torch
from torch import nn

from rlbus.config.trainer import LoraConfig
from rlbus.consumers.trainer.batching import MicroBatch
from rlbus.schemas.weights_file import LORA_A, LORA_B, WeightsKind

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel


def load_policy(
    path: str | Path, lora: LoraConfig, device: str = "cpu", gradient_checkpointing: bool = False
) -> nn.Module:
    from transformers import AutoModelForCausalLM

    # transformers' annotations take `to`'s first argument for self
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)  # pyright: ignore[reportArgumentType]
    if gradient_checkpointing:
        # Non-reentrant: gives the same gradients, and works when the inputs need no grad (LoRA).
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    if lora.enabled:
        from peft import LoraConfig as PeftLora
        from peft import get_peft_model

        targets = (
            lora.target_modules
            if lora.target_modules == "all-linear"
            else lora.target_modules.split(",")
        )
        model = get_peft_model(
            model,
            PeftLora(
                r=lora.rank,
                # peft annotates an int, and scales by any number (alpha / rank)
                lora_alpha=lora.alpha,  # pyright: ignore[reportArgumentType]
                lora_dropout=lora.dropout,
                target_modules=targets,
                task_type="CAUSAL_LM",
            ),
        )
    model.train()
    return model


def _is_peft(model: nn.Module) -> TypeGuard[PeftModel]:
    """Without importing peft, which only LoRA runs need installed."""
    return type(model).__module__.startswith("peft.")


def _base_name(name: str) -> str:
    return name.replace(".base_layer.", ".")


def tied_aliases(model: nn.Module) -> frozenset[str]:
    """Names (the base model's own) under which a parameter appears a second time, e.g.
    `lm_head.weight` of a model tying it to `model.embed_tokens.weight`. Published weights
    leave them out, as `save_pretrained` does; readers tie them back from the model."""
    base = model.get_base_model() if _is_peft(model) else model
    seen: set[int] = set()
    aliases = set()
    for name, param in base.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            aliases.add(_base_name(name))
        seen.add(id(param))
    return frozenset(aliases)


V = TypeVar("V")


def without(names: frozenset[str], state: dict[str, V]) -> dict[str, V]:
    return {k: v for k, v in state.items() if k not in names}


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight under the base model's own names (what inference loads), each tied one
    once: LoRA adapters are merged into a copy, so training goes on with the adapters
    separate."""
    aliases = tied_aliases(model)
    if not _is_peft(model):
        return without(
            aliases, {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        )
    model.merge_adapter()
    try:
        state = model.get_base_model().state_dict()
        return without(
            aliases,
            {
                _base_name(k): v.detach().cpu().clone().contiguous()
                for k, v in state.items()
                if "lora_" not in k
            },
        )
    finally:
        model.unmerge_adapter()


def adapter_deltas(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each LoRA-adapted layer's A and scaled B under the base module's name
    (schemas/weights_file.py): what travels on a version when only adapters are trained."""
    if not _is_peft(model):
        raise ValueError("the model has no LoRA adapters to publish (trainer.lora.enabled)")
    out: dict[str, torch.Tensor] = {}
    from peft.tuners.lora import LoraLayer

    for name, module in model.get_base_model().named_modules():
        if not isinstance(module, LoraLayer) or "default" not in module.lora_A:
            continue
        base = _base_name(name)
        a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        out[base + LORA_A] = a.detach().cpu().clone().contiguous()
        out[base + LORA_B] = (b.detach().cpu() * module.scaling["default"]).contiguous()
    return out


def frozen_names(model: nn.Module) -> frozenset[str]:
    """Names of the parameters training leaves as loaded (the base model under LoRA), each
    tied one under every name it has."""
    return frozenset(
        name
        for name, param in model.named_parameters(remove_duplicate=False)
        if not param.requires_grad
    )


FROZEN_SAMPLES = 4096
"""Values of each frozen tensor that `frozen_digest` reads."""


def frozen_digest(model: nn.Module) -> str:
    """A digest of the parameters training leaves as loaded (the base model under LoRA; "" when
    every one trains): their names, shapes, dtypes and up to FROZEN_SAMPLES evenly spaced values
    of each. Enough to tell the base a state was trained on from another model or another
    fine-tune of it, without reading every weight."""
    h = hashlib.blake2b(digest_size=16)
    frozen = [(name, param) for name, param in model.named_parameters() if not param.requires_grad]
    for name, param in frozen:
        flat = param.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // FROZEN_SAMPLES)].contiguous()
        h.update(f"{name} {tuple(param.shape)} {param.dtype}".encode())
        h.update(sample.view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest() if frozen else ""


def published_kind(lora: LoraConfig) -> WeightsKind:
    """What a weight version carries under these LoRA settings."""
    return "lora-delta" if lora.enabled and lora.publish == "adapter" else "full"


def published_weights(model: nn.Module, kind: WeightsKind) -> dict[str, torch.Tensor]:
    """The tensors a version of `kind` publishes (one process; FSDP gathers its own)."""
    return adapter_deltas(model) if kind == "lora-delta" else full_weights(model)


def token_logprobs(model: nn.Module, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] log-probs of each loss token given the tokens before it, under logits /
    temperature (0 where a token has no loss: nothing reads those), and the entropy of that
    distribution at the loss positions ([n], no grad).

    The head, the float copy and the log-softmax run only at the positions that predict a loss
    token: over a chat prompt they are a [tokens x vocabulary] tensor that no loss reads (with a
    49k vocabulary and a prompt longer than the answer, most of a step's head compute and
    memory)."""
    scored = mb.loss_mask[:, 1:] > 0
    # position i predicts token i + 1: keep the positions before each loss token
    keep = torch.nn.functional.pad(scored, (0, 1))
    logits = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        logits_to_keep=keep.to(mb.input_ids.device),
    ).logits.float()  # [n, V]: the kept positions, row-major
    rows = scored.nonzero()[:, 0].to(logits.device)
    log_dist = torch.log_softmax(logits / mb.temperature.to(logits.device)[rows, None], dim=-1)
    targets = mb.input_ids[:, 1:][scored].to(logits.device)
    picked = log_dist.gather(-1, targets[:, None]).squeeze(-1)
    with torch.no_grad():
        entropy = -(log_dist.exp() * log_dist).sum(-1)
    out = torch.zeros(mb.input_ids.shape, dtype=picked.dtype, device=picked.device)
    shifted = torch.nn.functional.pad(scored, (1, 0)).to(picked.device)
    return out.masked_scatter(shifted, picked), entropy


def save_model(model: nn.Module, out: str | Path, source: str | Path) -> None:
    """A plain Hugging Face directory (LoRA merged) with the source model's tokenizer."""
    from transformers import AutoTokenizer

    # peft forwards merge_and_unload to its tuner (its annotations do not show it): either way
    # what is saved is a transformers model
    plain = cast("PreTrainedModel", model.merge_and_unload() if _is_peft(model) else model)
    plain.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
