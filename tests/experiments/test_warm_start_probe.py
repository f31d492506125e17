"""experiments/warm_start_probe.py trains one warm-start phase, probes held-out turns and saves the model."""

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "model.tiny_overrides.hidden_size=32",
    "model.tiny_overrides.intermediate_size=64",
    "warm_start.demos=16",
    "warm_start.prior_demos=8",
    "warm_start.batch_size=8",
    "warm_start.epochs=2",
    "warm_start.warmup_steps=0",
]


def _probe():
    spec = importlib.util.spec_from_file_location(
        "warm_start_probe", REPO / "experiments" / "warm_start_probe.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_trains_a_phase_records_each_turn_and_saves_a_model_the_next_phase_starts_from(tmp_path):
    probe = _probe()
    config = str(REPO / "configs" / "qwen3_5-demo.yaml")
    fmt = tmp_path / "format"
    assert probe.main([config, str(fmt), *SMALL, "--probe-every", "2", "--held-out", "3"]) == 0
    rows = [json.loads(line) for line in (fmt / "probe.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4]  # before, every 2 steps, and the last (16 x 2 / 8 = 4)
    assert {"p_call", "tool_turn0", "tool_turn1", "direct_turn0"} <= set(rows[0])
    # a random init is flat (NLL ~ log 258 per byte); 4 SFT steps at lr 3e-3 lower the answer turn's NLL
    assert rows[0]["tool_turn1"] > 5.0 and rows[-1]["tool_turn1"] < rows[0]["tool_turn1"] - 0.2
    assert rows[0]["train_loss"] is None and rows[-1]["train_loss"] > 0
    # the prior phase starts from the format phase's saved model: its first probe equals the last one
    prior = tmp_path / "prior"
    args = [config, str(prior), *SMALL, "--phase", "prior", "--init", str(fmt / "step4"), "--held-out", "3"]
    assert probe.main(args) == 0
    first = json.loads((prior / "probe.jsonl").read_text().splitlines()[0])
    keys = ("p_call", "tool_turn0", "tool_turn1")
    assert {k: first[k] for k in keys} == {k: rows[-1][k] for k in keys}
    assert (prior / "step1" / "config.json").is_file()  # 8 demos, batch 8: one step
