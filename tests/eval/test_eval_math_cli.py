"""`rz eval` on a tiny random Qwen3 checkpoint (real engine, real Qwen3 tokenizer), configs and errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rz_agents.cli import main
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.checkpoint import save_hf_checkpoint

# Small and one-threaded: the suite runs on a shared 2-core machine.
FAST = ["--max-tokens", "16", "--num-threads", "1", "--max-running", "8"]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> str:
    """A random Qwen3 with the real vocabulary size (151,936) and a tiny body; no tokenizer.json (Qwen3's)."""
    cfg = ModelConfig.tiny(
        "qwen3",
        vocab_size=151936,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=4096,
    )
    model = Transformer(cfg)
    model.reset_parameters(std=0.05, seed=0)
    return str(save_hf_checkpoint(model, tmp_path_factory.mktemp("ckpt") / "tiny-qwen3"))


def test_tiny_checkpoint_over_aime24_prints_the_table_and_writes_json(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "result.json"
    argv = ["eval", "--checkpoint", tiny_checkpoint, "--benchmark", "aime24", "--limit", "3", "--k", "2"]
    assert main([*argv, *FAST, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "6/6" in captured.err  # the progress bar (stderr) counted every sample
    for pid, gold in (("aime2024-0", "204"), ("aime2024-1", "113"), ("aime2024-2", "371")):
        assert pid in text and gold in text
    assert "avg@2 (pass@1):" in text and "pass@2:" in text
    result = json.loads(out.read_text())
    assert result["num_problems"] == 3 and result["num_samples"] == 6 and result["num_failed"] == 0
    assert [p["num_samples"] for p in result["problems"]] == [2, 2, 2]
    assert all(1 <= s["tokens"] <= 16 for p in result["problems"] for s in p["samples"])
    assert result["sampling"]["temperature"] == 0.6 and result["sampling"]["top_p"] == 0.95
    assert 0.0 <= result["avg_at_k"] <= result["pass_at_k"] <= 1.0


def test_yaml_eval_section_sets_the_run_and_flags_override_it(tiny_checkpoint, tmp_path, capsys):
    config = tmp_path / "eval.yaml"
    config.write_text(
        f"model: {{ignored: by eval}}\neval:\n  checkpoint: {tiny_checkpoint}\n  benchmark: gsm8k\n"
        "  k: 3\n  limit: 2\n  temperature: 0.0\n  max_tokens: 64\n  kv_cache_gb: 0.0001\n"
    )
    assert (
        main(
            ["eval", str(config), "--k", "2", "--max-tokens", "8", "--num-threads", "1", "--quiet", "--json"]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["benchmark"] == "gsm8k" and result["k"] == 2 and result["num_problems"] == 2
    assert result["sampling"]["temperature"] == 0.0 and result["sampling"]["max_tokens"] == 8
    # the KV budget (107,374 bytes) sets the pages: as many as fit in it, one of them the scratch page of
    # padding rows (not counted in kv_pages / kv_bytes_total)
    pages, total = result["engine"]["kv_pages"], result["engine"]["kv_bytes_total"]
    page = total // pages
    assert pages >= 1 and total + page <= 0.0001 * 2**30 < total + 2 * page
    # greedy: both samples of a problem are the same tokens, so the same answer and length
    for p in result["problems"]:
        assert len({(s["answer"], s["tokens"]) for s in p["samples"]}) == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("eval:\n  temprature: 0.6\n", "eval.temprature: unknown field (did you mean temperature?)"),
        ("eval:\n  k: many\n", "eval.k: expected int, got 'many'"),
        ("eval:\n  k: 0\n", "eval.k: must be >= 1, got 0"),
        ("eval:\n  benchmark: aime99\n", "eval.benchmark: 'aime99' is neither a benchmark"),
        ("train: {}\n", "no 'eval:' section"),
    ],
)
def test_a_bad_config_gets_one_error_line_naming_the_field(tmp_path, capsys, body, message):
    config = tmp_path / "bad.yaml"
    config.write_text(body)
    assert main(["eval", str(config), "--checkpoint", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_missing_or_wrong_checkpoint_exits_2(tmp_path, capsys):
    assert main(["eval", "--benchmark", "gsm8k"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(tmp_path / "nope"), "--benchmark", "gsm8k"]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(tmp_path), "--benchmark", "gsm8k"]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_help_documents_the_production_settings(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--k 16..64 --temperature 0.6 --top-p 0.95" in text


def test_eval_osworld_delegates_and_rejects_bad_input(tmp_path, capsys):
    assert main(["eval", "osworld"]) == 2
    assert "needs --tasks" in capsys.readouterr().err
    assert main(["eval", "osworld", "--tasks", str(tmp_path / "missing"), "--policy", "noop"]) == 2
    assert "no task file" in capsys.readouterr().err


@pytest.mark.skipif(not (shutil.which("Xvfb") and shutil.which("openbox")), reason="needs xvfb and openbox")
def test_eval_osworld_runs_the_oracle_on_a_local_task(capsys):
    from rz_agents.envs.osworld import LOCAL_TASKS

    task = Path(LOCAL_TASKS) / "os" / "rz-os-rename-file.json"
    assert main(["eval", "osworld", "--tasks", str(task), "--policy", "oracle"]) == 0
    out = capsys.readouterr().out
    assert "rz-os-rename-file" in out and "success 1.000 over 1 tasks" in out


def test_tool_mode_runs_episodes_with_the_real_engine_and_sandbox(tiny_checkpoint, capsys):
    argv = ["eval", "--checkpoint", tiny_checkpoint, "--benchmark", "gsm8k", "--limit", "2", "--k", "1"]
    assert main([*argv, "--tool", "--max-tokens", "8", "--num-threads", "1", "--quiet", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tool"] is True and result["num_samples"] == 2 and result["num_failed"] == 0
    # an untrained model writes no tool call: each episode ends after its first (cut-off) turn
    assert all(
        s["tool_turns"] == 0 and 1 <= s["tokens"] <= 8 for p in result["problems"] for s in p["samples"]
    )


def test_a_tokenizer_mismatch_names_the_fix_and_the_training_config_applies_it(tmp_path, capsys):
    # a run directory of the byte-vocabulary demo kind: config.yaml (tokenizer: byte) + final_model
    model = Transformer(ModelConfig.tiny("qwen3", vocab_size=320, hidden_size=32, intermediate_size=64))
    model.reset_parameters(seed=0)
    checkpoint = save_hf_checkpoint(model, tmp_path / "run" / "final_model")
    config = tmp_path / "run" / "config.yaml"
    config.write_text("tokenizer: byte\nmodel: {model_type: qwen3}\neval: {}\n")
    argv = ["--checkpoint", str(checkpoint), "--benchmark", "gsm8k", "--limit", "1", "--k", "1", *FAST]
    assert main(["eval", *argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert (
        "the Qwen3 tokenizer (no tokenizer.json there) has 151669 tokens but the model's vocabulary is 320"
        in err
    )
    assert f"rz eval {config} --checkpoint {checkpoint}" in err
    assert main(["eval", str(config), *argv, "--quiet", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_samples"] == 1 and result["num_failed"] == 0
