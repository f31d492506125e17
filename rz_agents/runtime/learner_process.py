"""The learner in a child process, so its Python work never waits on the engine's GIL (and vice versa).

On CPU, small-model forwards are many small torch ops; engine and learner threads in one process then
take turns on the GIL and the learner step slows down several-fold while the engine is busy. This
wrapper runs the same ``Learner`` in a spawned process: trajectories go in through a pipe, metrics come
back, and new weights are written into shared-memory tensors that the engine copies from.
It has the ``Learner`` methods the runtime uses (step, weights, version, save_state, load_state).
"""

from __future__ import annotations

import atexit
import functools
import os
import signal
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from rz_agents.model.policy import PolicySpec
from rz_agents.model.weight_update import WeightUpdate
from rz_agents.runtime.plan import RunPlan
from rz_agents.trajectory import Trajectory


def _serve(conn, spec: PolicySpec, plan: RunPlan, shared, version: int, cpus) -> None:
    from rz_agents.model.policy import build_policy

    # The parent ends this process (``close``, or the pipe closing when the parent dies). A Ctrl-C reaches
    # the terminal's whole process group, a SIGTERM may reach every process of a job: the learner state
    # lives here, and the parent saves it on a graceful stop (runtime/stop.py).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if cpus:
        os.sched_setaffinity(0, cpus)
    if plan.num_threads is not None:
        torch.set_num_threads(plan.num_threads)
    model = build_policy(spec)  # the parent's policy (its frozen parts too), then the parent's weights
    model.load_state_dict(shared)
    learner = plan.build_learner(model, version=version)

    def publish() -> None:
        with torch.no_grad():
            for k, v in model.state_dict().items():
                shared[k].copy_(v)

    while True:
        cmd, arg = conn.recv()
        try:
            if cmd == "close":
                conn.send(("ok", None))
                return
            if cmd == "step":
                metrics = learner.step([Trajectory.from_dict(d) for d in arg])
                publish()
                conn.send(("ok", (metrics, learner.version, learner.skipped_steps)))
            elif cmd == "save_state":
                conn.send(("ok", learner.save_state(arg)))
            elif cmd == "load_state":
                learner.load_state(*arg)
                publish()
                conn.send(("ok", (learner.version, learner.skipped_steps)))
            elif cmd == "replace_weights":
                learner.replace_weights(arg)
                publish()
                conn.send(("ok", None))
            else:
                conn.send(("error", f"unknown command {cmd!r}"))
        except Exception as e:  # report to the parent; it decides
            conn.send(("error", f"{e!r}\n{traceback.format_exc()}"))


def _kill_if_alive(proc) -> None:
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=10)


class LearnerProcessError(RuntimeError):
    """The learner process reported an error or died."""


class LearnerProcess:
    """A ``Learner`` running in a spawned child process."""

    def __init__(
        self,
        model: torch.nn.Module,
        spec: PolicySpec,
        plan: RunPlan,
        version: int = 0,
        cpus: list[int] | None = None,
    ) -> None:
        """``model``: the policy whose weights the child starts from; ``spec``: the one it was built from
        (``model.policy.build_policy``: the child builds its own copy with it); ``plan``: the run's (learner
        config, sampling, lag bound, torch threads); ``cpus``: pin the learner process to these CPU ids (None:
        inherit the parent's)."""
        ctx = mp.get_context("spawn")
        self._shared = {k: v.detach().clone().share_memory_() for k, v in model.state_dict().items()}
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve,
            args=(child, spec, plan, self._shared, version, cpus),
            daemon=True,
            name="rz-learner",
        )
        self._proc.start()
        # The child ignores SIGTERM, so multiprocessing's exit hook (terminate, then join) would wait for it
        # forever if this process exited without ``close``: this hook, registered later and so run before
        # that one, kills it.
        self._reaper = functools.partial(_kill_if_alive, self._proc)
        atexit.register(self._reaper)
        child.close()
        self.cfg = plan.learner
        self.version = version
        self.skipped_steps = 0

    def _call(self, cmd: str, arg: Any = None) -> Any:
        try:
            self._conn.send((cmd, arg))
            status, value = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError) as e:
            raise LearnerProcessError(f"learner process died (exit code {self._proc.exitcode})") from e
        if status != "ok":
            raise LearnerProcessError(value)
        return value

    def step(self, batch: list[Trajectory]) -> dict[str, Any]:
        """Learner.step in the child; returns its metrics."""
        metrics, self.version, self.skipped_steps = self._call("step", [t.to_dict() for t in batch])
        return metrics

    def weights(self) -> dict[str, torch.Tensor]:
        """The latest weights (shared memory, updated by each step; copy before the next step)."""
        return self._shared

    def published_names(self) -> None:
        """None: the child shares (and so publishes) every weight, frozen parts included."""
        return None

    def weight_update(self) -> WeightUpdate:
        """The latest weights as a whole update (shared memory: ``snapshot`` it before the next step)."""
        return WeightUpdate(self.version, self._shared)

    def save_state(self, folder: str | Path) -> dict[str, Any]:
        """Learner.save_state in the child (it writes the tensors into ``folder``)."""
        return self._call("save_state", str(folder))

    def load_state(self, state: dict[str, Any], folder: str | Path | None) -> None:
        """Learner.load_state in the child (``folder`` None: a checkpoint of whole tensors, see there)."""
        where = None if folder is None else str(folder)
        self.version, self.skipped_steps = self._call("load_state", (state, where))

    def replace_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Learner.replace_weights in the child."""
        self._call("replace_weights", {k: v.detach().clone() for k, v in weights.items()})

    def close(self) -> None:
        """Stop the child process."""
        if self._proc.is_alive():
            try:
                self._call("close")
            except LearnerProcessError:
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
        atexit.unregister(self._reaper)
        self._conn.close()
