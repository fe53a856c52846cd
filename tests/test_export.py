"""Serving a trained run: `skyrl-tool-agent export --merge` (one plain bf16 model directory) and the
adapter itself on its base (peft, the project's loader) give the trained policy's logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl_tool_agent.commands.main import main
from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR, ModelConfig
from skyrl_tool_agent.policy.qwen import QwenPolicy


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[QwenPolicy, Path, torch.Tensor]:
    """The embedded model with LoRA adapters moved off zero (a trained policy), saved as training's
    final/ is (`QwenPolicy.save`), and a real prompt's token ids."""
    torch.manual_seed(0)
    policy = QwenPolicy.from_config(ModelConfig(device="cpu"), mode="lora")
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    final = tmp_path_factory.mktemp("run") / "final"
    policy.save(final)
    messages = [{"role": "user", "content": "Database: library\nQuestion: How many books are there?"}]
    ids = policy.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)["input_ids"]
    return policy, final, ids


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()[0]


def test_export_merge_gives_a_plain_bf16_model_with_the_trained_policys_logits(trained, tmp_path, capsys):
    policy, final, ids = trained
    policy.model.eval()
    expected = _logits(policy.model, ids)
    with policy.model.disable_adapter():
        base = _logits(policy.model, ids)
    adapter_effect = (expected - base).abs().max().item()
    assert adapter_effect > 0.5  # the adapters change the model: a merge that dropped them shows

    out = tmp_path / "merged"
    assert main(["export", str(final.parent), "--merge", "--output-dir", str(out)]) == 0  # a run dir: its final/
    assert "merged" in capsys.readouterr().out
    assert not (out / "adapter_config.json").exists() and (out / "merged_from.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(out)  # what any server does with a model directory
    assert merged.config.dtype == torch.bfloat16 and merged.dtype == torch.bfloat16
    got = _logits(merged.float(), ids)
    error = (got - expected).abs().max().item()
    assert error < 0.1 * adapter_effect, (error, adapter_effect)  # bf16 rounding of the merged weights only
    top2 = expected.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * error  # positions whose greedy token no rounding can flip
    assert clear.sum() >= len(clear) // 2 and torch.equal(got.argmax(-1)[clear], expected.argmax(-1)[clear])
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("SELECT 1")["input_ids"] == policy.tokenizer("SELECT 1")["input_ids"]
    assert tokenizer.chat_template == policy.tokenizer.chat_template

    # float32 export: the merge itself is exact
    out32 = tmp_path / "merged32"
    assert main(["export", str(final), "--merge", "--output-dir", str(out32), "--dtype", "float32"]) == 0
    exact = _logits(AutoModelForCausalLM.from_pretrained(out32), ids)
    assert (exact - expected).abs().max().item() < 1e-4


def test_the_adapter_itself_served_on_its_base_gives_the_trained_logits(trained):
    """What a server that loads LoRA adapters does (base + final/ through peft), and the project's
    own loader (`eval --model-path RUN/final`)."""
    from peft import PeftModel

    from skyrl_tool_agent.eval.policies import load_eval_policy

    policy, final, ids = trained
    policy.model.eval()
    expected = _logits(policy.model, ids)
    base = AutoModelForCausalLM.from_pretrained(SHIPPED_EMBEDDED_DIR, dtype=torch.float32)
    served = PeftModel.from_pretrained(base, final).eval()
    assert (_logits(served, ids) - expected).abs().max().item() < 1e-4
    loaded = load_eval_policy(str(final), ModelConfig(device="cpu"))
    assert (_logits(loaded.model, ids) - expected).abs().max().item() < 1e-4


def test_export_refusals_are_one_error_line(trained, tmp_path, capsys):
    _, final, _ = trained
    cases = [
        (["export", str(final), "--output-dir", str(tmp_path / "a")], "give --merge"),
        (["export", str(SHIPPED_EMBEDDED_DIR), "--merge", "--output-dir", str(tmp_path / "b")], "not a LoRA adapter"),
        (["export", str(tmp_path / "nothing"), "--merge", "--output-dir", str(tmp_path / "c")], "no such directory"),
        (["export", str(final), "--merge", "--output-dir", str(final)], "not empty"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and err.startswith("error:") and message in err and "\n" not in err, err


def test_a_qlora_adapters_merge_says_it_lands_on_a_base_it_never_trained_on(trained, tmp_path, capsys):
    """The run's config.yaml says QLoRA (model.quantization.load_in_4bit): the export merges as
    asked and says, in one `note:` line and in merged_from.json, that the merged model is not the
    trained policy (before: silence). A LoRA run's export says nothing of the kind."""
    import json
    import shutil

    _, final, _ = trained
    for four_bit in (True, False):
        run = tmp_path / f"run_{four_bit}"
        shutil.copytree(final, run / "final")
        (run / "config.yaml").write_text(f"model:\n  quantization:\n    load_in_4bit: {str(four_bit).lower()}\n")
        out = tmp_path / f"merged_{four_bit}"
        assert main(["export", str(run / "final"), "--merge", "--output-dir", str(out), "--dtype", "float32"]) == 0
        notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
        record = json.loads((out / "merged_from.json").read_text())
        if four_bit:
            assert len(notes) == 1 and "QLoRA adapter" in notes[0] and "never trained on" in notes[0], notes
            assert record["trained_on_4bit_base"] is True
        else:
            assert not notes and "trained_on_4bit_base" not in record
