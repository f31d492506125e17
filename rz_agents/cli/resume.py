"""Resuming `rz train`: the run directory's config.yaml is the run's config; its checkpoint.pt, its state.

`rz train --resume RUN_DIR [key=value ...]` rebuilds the config from RUN_DIR/config.yaml (so a run started
with a warm start, or from another checkpoint, comes back with exactly its settings) and continues from
RUN_DIR/checkpoint.pt; with no checkpoint yet it starts the same run over. The older spelling,
`rz train CONFIG --run-dir RUN_DIR resume_from=RUN_DIR/checkpoint.pt`, is the same resume; its config
must then agree with config.yaml. Either way only the fields in RESUMABLE may change: the others shape
the trajectories and the learner state in the checkpoint.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

from rz_agents.config_io import (
    ConfigError,
    from_dict,
    override_config,
    read_yaml_mapping,
    rename_fields,
    to_dict,
)

T = TypeVar("T")

CHECKPOINT = "checkpoint.pt"
CONFIG = "config.yaml"
# Fields a resume may change: how long, how often to save, reporting, where things run (not the algorithm).
RESUMABLE = (
    "description",
    "steps",
    "checkpoint_every",
    "watchdog_s",
    "tensorboard",
    "report",
    "summary_window",
    "export_final_model",
    "num_threads",
    "learner_process",
    "learner_cpus",
    "rollout_cpus",
    "learner_step_delay_s",
    "eval",
    "runtime",  # checkpoints are the same in both runtimes and for any actors
    "ray",
    "actors",
)
# Fields that always differ between the first start and a resume.
_IGNORED = ("resume_from", "output_dir")


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v and k not in ("kwargs", "tiny_overrides", "eval"):
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


def changed_fields(original: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted names of the fields whose values differ (except RESUMABLE and resume_from / output_dir)."""
    a, b = _flatten(original), _flatten(new)
    skip = RESUMABLE + _IGNORED
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k.split(".")[0] not in skip)


def _validated(cls: type[T], data: dict[str, Any]) -> T:
    cfg = from_dict(cls, data)
    try:
        cfg.validate()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return cfg


def config_for_resume(cls: type[T], run_dir: str | Path, overrides: list[str]) -> tuple[T, T]:
    """(the run's config with ``overrides``, the same resuming from the run dir's checkpoint if it has one).

    The first is what config.yaml keeps (``resume_from``: where the run first started); the second is the
    config to run. ConfigError names a missing config.yaml or an override of a field a resume cannot change.
    """
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG).is_file():
        raise ConfigError(f"{run_dir}: no {CONFIG} here (not a run directory of `rz train`)")
    fixed = [o for o in overrides if o.partition("=")[0].strip() in _IGNORED]
    if fixed:
        raise ConfigError(f"{', '.join(fixed)}: --resume continues from {run_dir / CHECKPOINT}, in {run_dir}")
    # (old config names, e.g. a run dir from before a rename, compare under their new names)
    original = rename_fields(cls, read_yaml_mapping(run_dir / CONFIG))
    data = override_config(cls, read_yaml_mapping(run_dir / CONFIG), overrides)
    bad = changed_fields(original, data)
    if bad:
        raise ConfigError(
            f"cannot change {', '.join(bad)} when resuming {run_dir} (the checkpoint was made with "
            f"{CONFIG}'s values); a resume may change only: {', '.join(RESUMABLE)}"
        )
    recorded = _validated(cls, dict(data, output_dir=str(run_dir)))
    checkpoint = run_dir / CHECKPOINT
    to_run = dataclasses.replace(recorded, resume_from=str(checkpoint)) if checkpoint.is_file() else recorded
    return recorded, to_run


def resumes_run_dir(cfg: Any, run_dir: Path) -> bool:
    """True if ``cfg.resume_from`` is this run directory's own checkpoint (a resume, not a new run)."""
    return bool(cfg.resume_from) and Path(cfg.resume_from).resolve() == (run_dir / CHECKPOINT).resolve()


def check_same_run(cfg: Any, run_dir: Path) -> dict[str, Any] | None:
    """For `rz train CONFIG --run-dir R resume_from=R/checkpoint.pt`: ConfigError if CONFIG disagrees with
    R/config.yaml on a field a resume cannot change. Returns config.yaml's content (None if absent)."""
    if not (run_dir / CONFIG).is_file():
        return None
    from rz_agents.cli.run_dir import anchor_paths

    original = read_yaml_mapping(run_dir / CONFIG)
    # config.yaml keeps paths absolute (anchor_paths): compare both so
    here = Path.cwd()
    bad = changed_fields(
        anchor_paths(rename_fields(type(cfg), original), here), anchor_paths(to_dict(cfg), here)
    )
    if bad:
        raise ConfigError(
            f"resuming {run_dir} with a config that differs from its {CONFIG} in {', '.join(bad)}; "
            f"`rz train --resume {run_dir}` resumes with the run's own config"
        )
    return original


def check_fresh_run_dir(run_dir: Path) -> None:
    """A new run must not overwrite another run's checkpoint (a rerun of the first command after a kill)."""
    if (run_dir / CHECKPOINT).is_file():
        raise ConfigError(
            f"{run_dir} already holds a run ({CHECKPOINT}); resume it with `rz train --resume {run_dir}`, "
            "or give another --run-dir"
        )
