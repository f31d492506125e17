"""evaluator_inventory: which metrics and getters task files use, and which are implemented."""

from __future__ import annotations

import importlib.util
import json

from rz_agents.envs.osworld.coverage import evaluator_inventory


def _write(path, evaluator):
    path.write_text(json.dumps({"id": path.stem, "instruction": "x", "evaluator": evaluator}))


def test_inventory_counts_tasks_per_name_and_sorts_them_by_status(tmp_path, monkeypatch):
    real = importlib.util.find_spec  # without librosa, compare_audios cannot score: blocked
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a, **k: None if n == "librosa" else real(n, *a, **k)
    )
    (tmp_path / "d").mkdir()
    _write(
        tmp_path / "a.json",
        {"func": "compare_config", "result": {"type": "vm_file"}, "expected": {"type": "rule"}},
    )
    _write(
        tmp_path / "d" / "b.json",
        {
            "func": ["compare_config", "no_such_metric", "compare_audios"],
            "result": [{"type": "vm_file"}, {"type": "googledrive_file"}, {"type": "no_such_getter"}],
            "expected": [{"type": "rule"}, None, {"type": "cloud_file"}],
        },
    )
    _write(tmp_path / "c.json", {"func": "", "result": {}})
    (tmp_path / "junk.json").write_text("{not json")
    inv = evaluator_inventory([tmp_path])
    assert inv["tasks"] == 3
    assert inv["metrics"]["compare_config"] == 2 and inv["metrics"][""] == 1
    assert inv["getters"]["vm_file"] == 2  # once per task, however many times it repeats there
    assert inv["metrics_missing"] == ["no_such_metric"]
    assert "compare_config" in inv["metrics_implemented"] and "compare_audios" in inv["metrics_blocked"]
    assert inv["getters_missing"] == ["no_such_getter"]
    assert "googledrive_file" in inv["getters_unavailable"]
