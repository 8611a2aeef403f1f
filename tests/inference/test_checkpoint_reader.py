"""Reading a weight version holds no memory once its tensors are gone. The inference role reads
every version the trainer publishes (a soak's tiny model: ~2,000 an hour); safetensors'
`load_file` (0.8.0) kept ~58 bytes of Python heap per tensor read, for ever: 2.3 KB a version
of the tiny model, ~4.7 MB an hour of a soak's inference, read by tracemalloc in an engine
driven alone."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rlbus.consumers.inference.checkpoint_reader import CheckpointError, read_checkpoint


def _version(path: Path, tensors: int = 40) -> dict[str, torch.Tensor]:
    weights = {f"layers.{i}.weight": torch.randn(16, 8) for i in range(tensors)}
    weights["empty.bias"] = torch.zeros(0)
    weights["half.weight"] = torch.randn(3, 5).to(torch.bfloat16)
    weights["step"] = torch.tensor(7)
    save_file(weights, str(path), metadata={"format": "pt"})
    return weights


def test_reading_a_version_again_and_again_holds_no_memory(tmp_path: Path) -> None:
    path = tmp_path / "v.safetensors"
    _version(path)
    for _ in range(10):  # first reads fill caches that do not grow after
        read_checkpoint(str(path))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(300):
            read_checkpoint(str(path))
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    held = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert held < 50_000, f"300 reads of a 43-tensor version left {held} bytes of Python heap"


def test_a_mapped_version_reads_back_tensor_for_tensor(tmp_path: Path) -> None:
    path = tmp_path / "v.safetensors"
    weights = _version(path, tensors=3)
    back = read_checkpoint(str(path)).tensors
    assert set(back) == set(weights)
    for name, tensor in weights.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape, name
        assert torch.equal(back[name], tensor), name
    back["layers.0.weight"].add_(1)  # a private mapping: the file keeps its bytes
    again = read_checkpoint(str(path)).tensors
    assert torch.equal(again["layers.0.weight"], weights["layers.0.weight"])


def test_a_truncated_version_is_refused_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "v.safetensors"
    _version(path, tensors=3)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="v.safetensors"):
        read_checkpoint(str(path))
