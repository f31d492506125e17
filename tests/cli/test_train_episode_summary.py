"""`rz train` shows failed episodes on the console: the progress line, the summary and summary.json."""

from __future__ import annotations

import json

from rz_agents.cli import main

TINY = (
    "steps: 3\nnum_threads: 1\nreport: false\nexport_final_model: false\nwarm_start: {demos: 0}\n"
    "env: {id: 'tests.cli.test_train_episode_summary:FlakyEnv'}\n"
    "rollout:\n  group_size: 2\n  groups_per_batch: 1\n  max_concurrent_episodes: 2\n"
    "  limits: {max_turns: 1, max_tokens_per_turn: 4, max_episode_tokens: 100}\n"
    "engine: {max_running: 4, max_len: 128}\n"
)

from rz_agents.envs import MultiTurnTextEnv  # noqa: E402


class FlakyEnv(MultiTurnTextEnv):
    """Every third episode's step raises."""

    episodes = 0

    def _reset(self, task, rng):
        FlakyEnv.episodes += 1
        self.n = FlakyEnv.episodes
        return "Say hi.", {}

    def _step(self, text):
        if self.n % 3 == 0:
            raise KeyError("flaky lookup")
        return None, 1.0, True, {}


def test_failed_episodes_are_counted_on_the_console_with_the_first_error(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(TINY)
    run_dir = tmp_path / "run"
    assert main(["train", str(path), "--run-dir", str(run_dir), "--no-progress"]) == 0
    out, err = capsys.readouterr()
    summary = json.loads((run_dir / "summary.json").read_text())["episodes"]
    assert summary["failed"] >= 1 and summary["first_error"].startswith(
        "env.step failed: KeyError: 'flaky lookup'"
    )
    line = next(x for x in out.splitlines() if x.startswith("episodes: "))
    running = summary["started"] - summary["finished"] - summary["failed"]
    assert line == (
        f"episodes: {summary['finished']} finished, {summary['failed']} failed, 0 rerun, 0 lost "
        f"(of {summary['started']} started" + (f"; {running} stopped with the run)" if running else ")")
    )
    assert "first failed episode: env.step failed: KeyError: 'flaky lookup' (group" in out
    assert "episodes failed" in err  # the progress lines say it as it happens
    log = (run_dir / "rz.log").read_text()
    assert 'raise KeyError("flaky lookup")' in log  # the env's own line, in the first failure's traceback
