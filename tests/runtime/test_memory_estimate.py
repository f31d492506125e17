"""Per-GPU memory estimate: exact parameter counts from meta-device builds of the real Qwen3 shapes, and
components that follow the config (dtype, checkpointing, KV cache)."""

from pathlib import Path

import pytest
import torch

from rz_agents.cli import main as rz_main
from rz_agents.engine import EngineConfig
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.kv_cache import bytes_per_page
from rz_agents.model.presets import preset_config, preset_for_checkpoint
from rz_agents.runtime import ModelSpec, TrainConfig
from rz_agents.runtime.memory_estimate import (
    GIB,
    count_parameters,
    estimate_memory,
    expected_sequence_positions,
    model_config_of,
)


def test_qwen3_4b_shape_builds_on_the_meta_device_with_its_published_size():
    cfg = preset_config("qwen3-4b")
    with torch.device("meta"):
        model = Transformer(cfg, init=False)
    assert all(p.is_meta for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as in the checkpoint
    assert 4.0e9 < model.num_parameters() < 4.05e9  # "4.0B parameters, 3.6B non-embedding"
    assert 3.6e9 < model.num_parameters() - cfg.vocab_size * cfg.hidden_size < 3.65e9
    assert 30.4e9 < count_parameters(preset_config("qwen3-30b-a3b")) < 30.6e9
    assert 0.59e9 < count_parameters(preset_config("qwen3-0.6b")) < 0.61e9


def test_qwen2_and_deepseek_v3_presets_have_their_published_sizes():
    assert 1.54e9 < count_parameters(preset_config("qwen2.5-1.5b-instruct")) < 1.55e9  # "1.54B"
    assert 7.6e9 < count_parameters(preset_config("qwen2.5-7b-instruct")) < 7.62e9  # "7.61B"
    assert 1.77e9 < count_parameters(preset_config("deepseek-r1-distill-qwen-1.5b")) < 1.78e9  # untied head
    # "671B" (without the MTP layer)
    assert 671.0e9 < count_parameters(preset_config("deepseek-v3")) < 671.1e9
    cfg, source = model_config_of(ModelSpec(checkpoint="/nowhere/DeepSeek-R1-Distill-Qwen-1.5B"))
    assert cfg.model_type == "qwen2" and cfg.qkv_bias and "absent here" in source


def test_a_missing_checkpoint_is_sized_by_its_directory_name():
    assert preset_for_checkpoint("/models/Qwen3-4B") == "qwen3-4b"
    assert preset_for_checkpoint("/models/other") is None
    cfg, source = model_config_of(ModelSpec(checkpoint="/nowhere/Qwen3-30B-A3B", dtype="bfloat16"))
    assert cfg.num_experts == 128 and "absent here" in source
    with pytest.raises(FileNotFoundError, match="matches no preset"):
        model_config_of(ModelSpec(checkpoint="/nowhere/mystery"))


def test_bf16_estimate_has_fp32_masters_and_adam_and_checkpointing_shrinks_activations():
    cfg = TrainConfig(engine=EngineConfig(max_running=4, max_len=1024), model=ModelSpec(dtype="bfloat16"))
    model_cfg = preset_config("qwen3-0.6b")
    est = estimate_memory(cfg, model_cfg)
    n = est.parameters
    assert est.learner["weights"] == 2 * n
    assert est.learner["master_weights_fp32"] == 4 * n
    assert est.learner["adamw_state_fp32"] == 8 * n
    # 28 layers x K and V x 8 kv heads x 64 positions x 128 dims x 2 bytes a page; 4 x 1024 positions
    # of pages plus the scratch page of padded decode rows
    assert est.engine["kv_cache"] == (4 * 1024 // 64 + 1) * 28 * 2 * 8 * 64 * 128 * 2
    assert est.learner_sharded(8) < est.learner_total
    fp32 = estimate_memory(cfg, model_cfg.replace(dtype="float32"))
    assert "master_weights_fp32" not in fp32.learner
    assert any("checkpointing" in note for note in est.notes)
    assert est.one_device_total / GIB > 10
    # the switch the model honours (ModelSpec -> ModelConfig.activation_checkpointing) sizes activations
    on = estimate_memory(
        TrainConfig(engine=cfg.engine, model=ModelSpec(dtype="bfloat16", activation_checkpointing=True)),
        model_cfg,
    )
    assert est.activation_checkpointing is False and on.activation_checkpointing is True
    assert on.learner["activations"] < est.learner["activations"]
    assert on.learner["lm_head_logits"] <= est.learner["lm_head_logits"]


def test_kv_cache_bytes_setting_sizes_the_cache():
    cfg = TrainConfig(engine=EngineConfig(max_len=512, kv_cache_bytes=10 * 2**20))
    tiny = ModelConfig.tiny("qwen3")
    est = estimate_memory(cfg, tiny)
    page = bytes_per_page(tiny)
    assert est.engine["kv_cache"] == (10 * 2**20 // page) * page


def test_the_paged_cache_holds_more_sequences_than_slots_at_realistic_lengths():
    qwen = preset_config("qwen3-4b")
    cfg = TrainConfig(engine=EngineConfig(max_running=512, max_len=16384), model=ModelSpec(dtype="bfloat16"))
    est = estimate_memory(cfg, qwen)
    # the default budget is max_running x max_len; a slot cache would hold max_running sequences
    assert est.slot_cache_sequences == 512
    mean = expected_sequence_positions(16384)
    assert 3800 < mean < 3900  # (16384 - 256) / ln(64)
    assert est.concurrent_sequences == 512  # capped by max_running ...
    capped = estimate_memory(
        TrainConfig(engine=EngineConfig(max_running=48, max_len=16384, kv_cache_bytes=48 * 16384 * 147456)),
        qwen,
    )
    assert capped.slot_cache_sequences == 48 and 190 < int(48 * 16384 / (mean + 32)) <= 48 * 5
    assert capped.concurrent_sequences == 48  # ... here by max_running too
    roomy = estimate_memory(
        TrainConfig(engine=EngineConfig(max_running=1024, max_len=16384, kv_cache_bytes=48 * 16384 * 147456)),
        qwen,
    )
    assert roomy.concurrent_sequences == int(48 * 16384 / (mean + 32)) and roomy.concurrent_sequences > 4 * 48
    assert any("concurrent sequences per replica" in n for n in roomy.notes)


def test_rz_train_dry_run_prints_the_estimate_for_the_production_config(capsys):
    config = Path(__file__).resolve().parents[2] / "configs" / "qwen3-4b-python-tool.yaml"
    assert rz_main(["train", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4.02B parameters" in out and "kv_cache" in out and "adamw_state_fp32" in out
    assert "published config" in out
    assert "activation checkpointing on" in out  # the production configs turn it on
    # runtime: ray: each side on GPUs of its own, the KV cache sized to one replica's GPU
    replica = next(line for line in out.splitlines() if "per engine replica" in line)
    rank = next(line for line in out.splitlines() if "per learner rank" in line)
    assert "8 replicas" in replica and "H200 141GB: fits" in replica
    assert "FSDP2 over 8 ranks" in rank and "H200 141GB: fits" in rank


def test_rz_train_dry_run_finds_a_packaged_config_by_name(capsys):
    assert rz_main(["train", "qwen3-30b-a3b-python-tool", "--dry-run"]) == 0
    out = capsys.readouterr().out
    rank = next(line for line in out.splitlines() if "per learner rank" in line)
    assert "FSDP2 over 16 ranks" in rank and "H200 141GB: fits" in rank  # with activation checkpointing


def test_rz_train_dry_run_sizes_a_packaged_model_and_the_osworld_learner_fits_beside_its_desktops(capsys):
    # model.checkpoint: smollm2-135m-instruct (a packaged model's name) was "not on this machine" for the dry
    # run while training found it. Without layer checkpointing that learner took 16 GiB of a 24 GiB node (the
    # kernel killed it mid-run beside 4 desktops); the config turns checkpointing on.
    assert rz_main(["train", "osworld-local", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct (config.json), 0.13B parameters" in out
    learner = next(line for line in out.splitlines() if line.strip().startswith("learner:"))
    # (4.3 GiB with checkpointing, since the estimate counts the learner's start-up and the LM head's gradient
    # partials; SmolLM2's measured peaks are within 10% of it: tests/runtime/test_memory_estimate_measured.py)
    assert "activation checkpointing on" in out and float(learner.split()[1]) < 5.0, learner


def test_a_cpu_run_that_would_not_fit_in_free_memory_is_warned_with_what_checkpointing_needs():
    from rz_agents.cli.configs import resolve_config
    from rz_agents.cli.train import RunConfig
    from rz_agents.config_io import load_config
    from rz_agents.runtime.memory_estimate import cpu_memory_warning

    gib = 2**30
    # the engine's share follows engine.max_running: pinned, so the figures do not move with the config's size
    off = load_config(
        RunConfig,
        resolve_config("osworld-local"),
        ["model.activation_checkpointing=false", "engine.max_running=8"],
    )
    line = cpu_memory_warning(off, available=12 * gib)
    assert line.startswith("this run needs ~17.4 GiB (learner 14.8, of it activations 9.9; engine 2.7)"), line
    assert "12.0 GiB available; model.activation_checkpointing=true needs ~4.3 GiB for the learner" in line
    assert cpu_memory_warning(off, available=40 * gib) is None
    on = load_config(RunConfig, resolve_config("osworld-local"), [])
    assert "activation_checkpointing=true" not in cpu_memory_warning(on, available=4 * gib)  # already on
    assert cpu_memory_warning(on, available=9 * gib) is None
    gpu = load_config(RunConfig, resolve_config("qwen3-4b-python-tool"), [])
    assert cpu_memory_warning(gpu, available=1 * gib) is None  # sized per GPU by --dry-run instead


def test_sharded_ranks_count_one_gathered_tensor_for_publication_not_a_whole_copy():
    from rz_agents.runtime.config import ActorsConfig
    from rz_agents.runtime.ray.weight_broadcast import BUCKET_BYTES

    model_cfg = preset_config("qwen3-0.6b")
    spec = ModelSpec(dtype="bfloat16")
    est = {}
    for transport in ("object_store", "broadcast"):
        cfg = TrainConfig(
            model=spec, runtime="ray", actors=ActorsConfig(learner_ranks=8, weight_transport=transport)
        )
        est[transport] = estimate_memory(cfg, model_cfg)
    largest = model_cfg.vocab_size * model_cfg.hidden_size  # the embedding (tied with the LM head)
    assert est["object_store"].learner["publication_transient"] == 2 * largest
    assert est["broadcast"].learner["publication_transient"] == max(2 * largest, 2 * BUCKET_BYTES)
    assert est["object_store"].learner["publication_transient"] < est["object_store"].learner["weights"] / 3
    # per rank: the sharded state plus what is gathered whole (publication, FSDP2's unsharded layers)
    rank = est["object_store"]
    assert rank.learner_rank_total == rank.learner_sharded(8)
    assert rank.learner["fsdp_unsharded_layers"] > 0
    single = estimate_memory(
        TrainConfig(model=spec, runtime="ray", actors=ActorsConfig(learner_ranks=1)), model_cfg
    )
    assert "publication_transient" not in single.learner  # one rank publishes views of its own weights


def test_a_cuda_estimate_has_none_of_the_cpu_process_terms():
    """gpu_check's train_16k compares a CUDA step's peak with the estimate for the device it ran on: the CPU
    process baseline and the packed-GEMM weight copies are a CPU run's, not a GPU's allocator's."""
    model_cfg = preset_config("qwen3-0.6b")
    cpu = estimate_memory(TrainConfig(model=ModelSpec(device="cpu")), model_cfg)
    gpu = estimate_memory(TrainConfig(model=ModelSpec(device="cuda")), model_cfg)
    assert "process_baseline" in cpu.learner and "process_baseline" not in gpu.learner
    assert gpu.learner_total < cpu.learner_total
    assert gpu.learner["weights"] == cpu.learner["weights"]
