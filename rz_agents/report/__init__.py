"""Run reports: PNG plots and a self-contained report.html from a run's metrics.jsonl."""

from rz_agents.report.write import write_report

__all__ = ["write_report"]
