"""report.html states a fired collapse alarm at the top and plots the health figures."""

import json

from rz_agents.report.write import write_report
from rz_agents.trainer.health import HealthThresholds, health_summary


def test_report_shows_the_alarm_and_the_health_panel(tmp_path):
    rows = [
        {"step": i, "reward_mean": 0.5, "kl_k3_behavior_to_learner": 0.1 * i, "is_weight_ess_fraction": 0.9}
        for i in range(12)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"health": health_summary(rows, HealthThresholds())}
    assert summary["health"]["status"] == "alarm"
    html = write_report(tmp_path, summary).read_text()
    assert "Health alarm from step 10" in html and "lower learner.optim.lr" in html
    assert (tmp_path / "plots" / "health.png").is_file()
    quiet = write_report(tmp_path, {"health": health_summary(rows[:3])}).read_text()
    assert "Health alarm" not in quiet
