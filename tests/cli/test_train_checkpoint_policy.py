"""`rz train` on a checkpoint with its own tokenizer (tokenizer: checkpoint), the word-problem warm start,
the exported HF model, and `rz eval` on it with the compact prompt; plus the related config errors."""

import json
import shutil

import pytest

from rz_agents.cli import main
from rz_agents.cli.train import RunConfig
from rz_agents.config_io import ConfigError, load_config
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.checkpoint import save_hf_checkpoint
from rz_agents.model.gguf import smollm2_checkpoint_dir
from rz_agents.model.packaged import resolve_checkpoint
from rz_agents.runtime.config import TrainConfig
from rz_agents.runtime.factories import build_tokenizer


@pytest.fixture(scope="module")
def tiny_smollm2(tmp_path_factory):
    """A tiny random Llama with SmolLM2's real vocabulary, tokenizer.json and chat template."""
    source = smollm2_checkpoint_dir()
    cfg = ModelConfig.tiny(
        "llama",
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=1024,
    )
    model = Transformer(cfg)
    model.reset_parameters(std=0.05, seed=0)
    out = save_hf_checkpoint(model, tmp_path_factory.mktemp("ckpt") / "tiny-smollm2")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out / name)
    return out


def _config(tmp_path, checkpoint) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(
        f"mode: sync\nsteps: 1\nnum_threads: 1\ntokenizer: checkpoint\nmodel: {{checkpoint: {checkpoint}}}\n"
        "env:\n  id: rz_agents/WordProblemTool-v0\n  kwargs: {max_turns: 2, prewarm: false}\n"
        "engine: {max_running: 8, max_len: 320}\n"
        "rollout:\n  group_size: 2\n  groups_per_batch: 2\n  max_concurrent_episodes: 4\n"
        "  limits: {max_turns: 2, max_tokens_per_turn: 12, max_episode_tokens: 240}\n"
        "warm_start: {demos: 8, task: word_problems, epochs: 1, batch_size: 4, warmup_steps: 1, "
        "kernels: standard, lr: 0.001}\n"
        "eval: {benchmark: word_problems, tool: true, prompt_style: compact}\n"
    )
    return str(path)


def test_train_exports_models_with_the_tokenizer_and_eval_reads_them(tiny_smollm2, tmp_path, capsys):
    run_dir = tmp_path / "run"
    config = _config(tmp_path, tiny_smollm2)
    assert main(["train", config, "--run-dir", str(run_dir), "--no-progress"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["lag0_max_abs_dlogp"] == 0.0  # the SFT's kernels did not leak
    assert summary["warm_start"]["format"]["steps"] == 2
    for name in ("warm_start_model", "final_model"):
        exported = run_dir / name
        assert (exported / "config.json").is_file() and (exported / "model.safetensors").is_file()
        assert (exported / "tokenizer.json").read_bytes() == (tiny_smollm2 / "tokenizer.json").read_bytes()
    capsys.readouterr()
    out = tmp_path / "eval.json"
    argv = ["eval", config, "--checkpoint", str(run_dir / "final_model"), "--limit", "2", "--k", "1"]
    argv += ["--max-tokens", "8", "--max-turns", "2", "--num-threads", "1", "--max-running", "4"]
    assert main([*argv, "--out", str(out), "--save-text", "--quiet"]) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] == "word_problems" and result["num_samples"] == 2 and result["num_failed"] == 0
    assert result["config"]["prompt_style"] == "compact" and result["tool"] is True


def test_tokenizer_checkpoint_uses_the_checkpoints_template(tiny_smollm2):
    tok, template = build_tokenizer("checkpoint", str(tiny_smollm2))
    text = tok.decode(template.encode_prompt(tok, [{"role": "user", "content": "Hi?"}]))
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert resolve_checkpoint("smollm2-135m-instruct") == smollm2_checkpoint_dir()


def test_config_errors_name_the_field(tmp_path, tiny_smollm2):
    with pytest.raises(ValueError, match="tokenizer: checkpoint needs model.checkpoint"):
        TrainConfig(tokenizer="checkpoint").validate()
    with pytest.raises(ValueError, match="tokenizer must be one of"):
        TrainConfig(tokenizer="gpt2").validate()
    with pytest.raises(FileNotFoundError, match="not an HF checkpoint directory .* packaged model"):
        resolve_checkpoint(str(tmp_path / "nowhere"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("warm_start: {demos: 4, task: poems}\n")
    with pytest.raises(ConfigError, match="warm_start.task must be"):
        load_config(RunConfig, bad)
    bad.write_text("learner_process: true\nwarm_start: {demos: 4}\n")
    with pytest.raises(ConfigError, match="warm_start with learner_process"):
        load_config(RunConfig, bad)


def test_missing_checkpoint_is_one_error_line_and_exit_2(tmp_path, capsys):
    config = _config(tmp_path, tmp_path / "no-such-model")
    assert main(["train", config, "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "rz train: cannot build the run: checkpoint" in err and "no-such-model" in err
    assert "Traceback" not in err


def test_eval_loads_a_packaged_model_by_name():
    from rz_agents.eval.checkpoint_policy import load_checkpoint_policy

    policy = load_checkpoint_policy("smollm2-135m-instruct")
    assert policy.model.config.vocab_size == 49152 and policy.name == smollm2_checkpoint_dir().name
    assert "SmolLM" in policy.tokenizer.decode(policy.template.encode_prompt(policy.tokenizer, []))
