"""`rz train visual-click-demo` (the packaged VLM config) end to end, cut small: the visual_click warm start
on pictures, async RL on the aligned engine with images, in-loop evaluation on the held-out split, and the
run's own lag-0 check: every lag-0 token's |dlogp| is 0.0."""

import json

from rz_agents.cli import main


def test_the_visual_click_demo_runs_and_its_lag0_tokens_are_exact(tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = [
        "steps=2", "rollout.group_size=2", "rollout.groups_per_batch=2", "rollout.max_concurrent_episodes=4",
        "warm_start.demos=8", "warm_start.epochs=1", "warm_start.batch_size=4", "warm_start.warmup_steps=0",
        "eval.every=2", "eval.k=1",
    ]  # fmt: skip
    argv = ["train", "visual-click-demo", "--run-dir", str(run_dir), "--no-progress", *overrides]
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["warm_start"]["format"]["steps"] == 2
    assert summary["lag0_max_abs_dlogp"] == 0.0 and summary["lag0_tokens_checked"] > 0
    assert summary["episodes"]["failed"] == 0
    assert summary["eval"] and summary["eval"][-1]["step"] == 1  # the held-out split, after the last step
    assert (run_dir / "warm_start_model" / "config.json").is_file()
    assert json.loads((run_dir / "warm_start_model" / "config.json").read_text())["model_type"] == "qwen3_vl"


def test_the_vl_template_is_chosen_from_the_model_spec_without_building_the_model():
    """What the Ray driver uses (it builds no model): the spec's Qwen3-VL config equals the built model's,
    so the template's placeholder runs match the engines' and learners' models; a text model keeps the
    byte template."""
    from rz_agents.cli.train import load_run_config
    from rz_agents.rollout.byte_chat import ByteChatTemplate
    from rz_agents.rollout.byte_vl_chat import ByteVLChatTemplate
    from rz_agents.runtime.config import ModelSpec
    from rz_agents.runtime.factories import build_model, policy_template, spec_vl_config

    spec = load_run_config("visual-click-demo").model
    vl = spec_vl_config(spec, 320)
    assert vl == build_model(spec, 320).vl_config and vl.vision.patch_size == 16
    assert isinstance(policy_template(ByteChatTemplate(), vl), ByteVLChatTemplate)
    assert spec_vl_config(ModelSpec(), 320) is None
    assert type(policy_template(ByteChatTemplate(), None)) is ByteChatTemplate


def test_the_inspector_of_a_vision_language_run_shows_its_screenshots(tmp_path):
    """As a user runs it (subprocess `rz train`): the inspector page of the recorded step shows the pictures
    each episode saw, the files under run_dir/inspect/images/ being the episodes' own PNGs."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    overrides = [
        "steps=1", "rollout.group_size=2", "rollout.groups_per_batch=2", "rollout.max_concurrent_episodes=4",
        "warm_start.demos=4", "warm_start.epochs=1", "warm_start.batch_size=4", "warm_start.warmup_steps=0",
        "inspect_steps=[0]",
    ]  # fmt: skip
    argv = [sys.executable, "-m", "rz_agents", "train", "visual-click-demo", "--run-dir", str(run_dir)]
    done = subprocess.run([*argv, *overrides], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((run_dir / "inspect" / "step_00000.json").read_text())
    images = [path for ep in record["episodes"] for path in ep["images"]]
    assert len(images) == 4 and all(len(ep["image_at"]) == 1 for ep in record["episodes"])  # one each
    page = (run_dir / "inspector.html").read_text()
    sources = [s.split('"')[0] for s in page.split('<img class="obs" src="')[1:]]
    assert sorted(sources) == sorted(f"inspect/{path}" for path in images)  # (groups in the page's order)
    assert all((run_dir / s).read_bytes().startswith(b"\x89PNG") for s in sources)
