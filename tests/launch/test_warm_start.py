"""The SFT warm start of a chat model on reverse_text (examples/reverse_text/warm_start.py): a
scripted teacher speaking the model's own tokenizer and chat template, its rollouts through the
real broker and chdb, and `rlbus replay sft` on them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.bpe_model import IM_END, smollm2_dir, smollm2_tokenizer, tiny_bpe_model

from rlbus.bus.store import open_store
from rlbus.environment import load_environment
from rlbus.launch import recipe

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "reverse_text" / "warm_start.py"


def test_the_chat_teacher_answers_reverse_texts_own_prompt_right() -> None:
    env = load_environment("rlbus.environment.reverse_text:ReverseText")
    tok = smollm2_tokenizer()
    teach = recipe.chat_teacher(smollm2_dir(), recipe.reversed_last_word)
    tasks = recipe.train_tasks(env, "teacher", 8)
    for task in tasks:
        text = tok.apply_chat_template(
            env.taskset.messages(task), add_generation_prompt=True, tokenize=False
        )
        assert tok.decode(teach(tok.encode(str(text), add_special_tokens=False))) == (
            task.answer + IM_END
        )
    bare = tok.encode("Reverse the text: abcde", add_special_tokens=False)
    with pytest.raises(ValueError, match="chat template opens the model's turn"):
        teach(bare)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_warm_start_trains_a_chat_model_on_its_teachers_reversals(tmp_path: Path) -> None:
    """Tasks of the RL config's training split answered by the teacher, every one right and
    stored with its token ids; SFT on them, as a run of its own; the model written."""
    model = tiny_bpe_model(tmp_path / "tiny")
    sft = tmp_path / "sft.toml"
    sft.write_text("batch_size = 8\nsteps = 3\n[trainer.lora]\nenabled = true\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLBUS_")}
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *("--model", str(model), "--out", str(tmp_path / "out")),
            *("--tasks", "16", "--sft-config", str(sft), "--run-id", "w"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    with open_store(f"chdb://{tmp_path / 'rlbus-data'}", read_only=True) as store:
        teacher = store.query(
            "SELECT count(), countIf(s.rewards['exact'] = 1), "
            "countIf(JSONExtractString(r.info, 'split') = 'train') FROM scored AS s FINAL "
            # A task redelivered under load is rolled out again under the same rollout id, and
            # the second copy (its timings differ) is kept beside the first (the conflicts view):
            # one row per rollout id.
            "INNER JOIN (SELECT rollout_id, any(info) AS info FROM rollouts FINAL "
            "WHERE run_id = 'w-teacher' GROUP BY rollout_id) "
            "AS r ON s.rollout_id = r.rollout_id WHERE s.run_id = 'w-teacher'"
        ).rows[0]
        steps = store.query(
            "SELECT count(), sum(num_samples) FROM train_steps FINAL WHERE run_id = 'w-sft'"
        ).rows[0]
        versions = store.query(
            "SELECT groupArray(version) FROM (SELECT version FROM weight_versions FINAL "
            "WHERE run_id = 'w-sft' ORDER BY version)"
        ).rows[0][0]
    assert teacher == (16, 16, 16)
    assert steps == (3, 24)
    assert versions == [0, 3]
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert "loss" in result.stdout and "16 rollouts of w-teacher scored" in result.stdout
