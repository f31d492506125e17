"""`rz train` decides its plan once: one `resolve` per run, the run built from that plan, and the runtime
never runs the CLI's own checks (it validates only the run schema when it is handed no plan)."""

import rz_agents.runtime.config as runtime_config
from rz_agents.cli import main
from rz_agents.cli.train import RunConfig, load_run_config
from rz_agents.runtime import LocalRun

FAST = ["steps=1", "warm_start.demos=0", "warm_start.prior_demos=0", "report=false", "--no-progress"]


def _count_resolves(monkeypatch) -> list[int]:
    calls = []
    real = runtime_config.resolve

    def counting(cfg):
        calls.append(1)
        return real(cfg)

    monkeypatch.setattr(runtime_config, "resolve", counting)
    return calls


def test_rz_train_resolves_its_config_once(tmp_path, monkeypatch, one_torch_thread):
    calls = _count_resolves(monkeypatch)
    assert main(["train", "demo", "--run-dir", str(tmp_path / "run"), *FAST]) == 0
    assert len(calls) == 1


def test_a_run_handed_its_plan_does_not_validate_again(monkeypatch, one_torch_thread):
    cfg = load_run_config("demo", ["warm_start.demos=0", "warm_start.prior_demos=0"], validate=False)
    plan = cfg.validate()
    calls = _count_resolves(monkeypatch)
    monkeypatch.setattr(RunConfig, "validate", lambda self: (_ for _ in ()).throw(AssertionError("climbed")))
    run = LocalRun(cfg, plan)
    try:
        assert run.plan is plan and calls == []
    finally:
        run.close()


def test_without_a_plan_the_runtime_checks_only_the_run_schema(monkeypatch, one_torch_thread):
    cfg = load_run_config("demo", ["warm_start.demos=0", "warm_start.prior_demos=0"], validate=False)
    calls = _count_resolves(monkeypatch)
    monkeypatch.setattr(RunConfig, "validate", lambda self: (_ for _ in ()).throw(AssertionError("climbed")))
    run = LocalRun(cfg)
    try:
        assert len(calls) == 1 and run.plan.lag.bound == cfg.rollout.max_lag
    finally:
        run.close()
