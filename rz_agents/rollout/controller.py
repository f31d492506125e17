"""The rollout controller: runs groups of episodes concurrently and feeds the learner within the lag bound.

Admission control: a group may start only while

    groups_started - groups_dropped < (steps_done + ahead) * groups_per_batch

(the right side capped at ``last_batch`` * groups_per_batch when the run's length is known: no rollouts for
batches no step will train), where steps_done counts finished learner steps and ahead is the run's
``LagPolicy.ahead_batches()`` (min(max_lag + 1, max_ahead_batches); 1 with a fixed lag), max_lag its
``bound``. A group admitted under this rule is, in order of start, among the next max_lag + 1 batches, so its
tokens would be trained at most max_lag versions later. Groups finish out of order, so
``TrajectoryQueue.take`` also drops (and counts) any group whose oldest token has lag > max_lag (or > the lag
governor's bound, when it is lower: ``LagBound.train``): no trained token ever exceeds the bound. max_lag = 0
is the synchronous mode: one batch is generated with the current weights, trained, published, then the next
one starts.

Accounting: every started group is in exactly one place: in flight (or waiting to be relaunched after a
resume), queued, taken by the learner (``next_batch`` returned it, ``step_done`` not yet called), trained,
or dropped. The ``GroupLedger`` (group_ledger.py) records that place and the counters; ``state_dict``
saves it as a consistent cut, which ``GroupLedger.check`` verifies. If the learner waits
for a batch that no group can ever fill (nothing queued or in flight and admission closed), ``next_batch``
raises RolloutDeadlock naming the counts instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rz_agents.engine.params import SamplingParams
from rz_agents.rollout.agent_loop import AgentLoop, EpisodeError, EpisodeLimits, EpisodeSpec, InfraFailure
from rz_agents.rollout.episode_runner import EpisodeRunner
from rz_agents.rollout.group_ledger import STATE_FORMAT, Counters, GroupLedger
from rz_agents.rollout.lag_bound import LagBound
from rz_agents.rollout.lag_policy import LagPolicy
from rz_agents.rollout.task_source import TaskSource
from rz_agents.rollout.trajectory_queue import Group, TrajectoryQueue
from rz_agents.sampling import SamplingSpec
from rz_agents.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass
class RolloutConfig:
    """How many episodes, how they are grouped, and what to do when they fail. How stale they may be and
    how to sample are the run's ``LagPolicy`` and ``SamplingSpec``, given to the controller beside this."""

    group_size: int = 4  # G samples per prompt
    groups_per_batch: int = 4  # groups per learner step
    max_concurrent_episodes: int = 16  # N: the most episodes in flight at once
    limits: EpisodeLimits = field(default_factory=EpisodeLimits)
    seed: int = 0
    # Stop the run (RolloutFailure) after this many episodes in a row failed: a broken env or a prompt that
    # cannot fit is a configuration error, not bad luck. 0 disables the check.
    max_consecutive_failures: int = 256
    # An episode lost to infrastructure (its engine replica or env worker died, its sandbox or desktop was
    # gone, see InfraFailure) is run again from its start, same task, new sampling seed, up to this many
    # times; then it is masked: left out of its group's baseline and the loss, counted (infra_failed), never
    # scored. Both are counted (episodes_rerun, infra_failed).
    max_episode_reruns: int = 2
    # Names of exception classes which, raised by env.reset / env.step (the class or a base of it), mean the
    # infrastructure failed, not the policy: e.g. [TimeoutError] for an env whose own timeout waits on a
    # desktop or a remote service. Any other env exception drops the episode as an env error.
    infra_exceptions: list[str] = field(default_factory=list)
    # A group whose rewards are all equal has advantage 0: the learner leaves it out of its forward/backward
    # (counted per step: groups_skipped_uniform). With oversample: k > 0, up to k such groups per learner
    # step are dropped as they finish (groups_dropped_uniform) and replacements are started, so batches hold
    # groups that teach something; beyond k per step they are queued and skipped by the learner.
    skip_uniform_groups: bool = False
    oversample: int = 0  # k: uniform-reward groups replaced per learner step (needs skip_uniform_groups)
    # What happens to a finished group older than the admission bound (the lag governor's, when it is below
    # max_lag): "pace" trains it (its per-token IS weights carry the staleness) and keeps every trained token
    # within max_lag by pacing: admission holds back new groups while the oldest one in flight would pass
    # the admission bound, and the learner waits for a group in flight rather than train a step after which
    # that group would be past max_lag. "drop" drops it (rollout_groups_dropped_stale): the behavior before
    # issue 43, which biases training toward short episodes (long ones are the ones that age).
    stale_groups: str = "pace"

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        for name in ("group_size", "groups_per_batch", "max_concurrent_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_episode_reruns < 0:
            raise ValueError(f"rollout.max_episode_reruns must be >= 0, got {self.max_episode_reruns}")
        for name in self.infra_exceptions:
            if not (isinstance(name, str) and name.isidentifier()):
                raise ValueError(
                    "rollout.infra_exceptions must list exception class names (e.g. TimeoutError), got "
                    f"{name!r}"
                )
        if self.stale_groups not in STALE_GROUPS:
            raise ValueError(f"rollout.stale_groups must be one of {STALE_GROUPS}, got {self.stale_groups!r}")
        if self.oversample < 0:
            raise ValueError(f"rollout.oversample must be >= 0, got {self.oversample}")
        if self.oversample and not self.skip_uniform_groups:
            raise ValueError(
                "rollout.oversample replaces uniform-reward groups: set rollout.skip_uniform_groups"
            )
        if self.max_concurrent_episodes < self.group_size:
            raise ValueError(
                f"rollout.max_concurrent_episodes ({self.max_concurrent_episodes}) must be >= "
                f"rollout.group_size ({self.group_size})"
            )
        if self.limits.max_turns < 1 or self.limits.max_tokens_per_turn < 1:
            raise ValueError("rollout.limits.max_turns and max_tokens_per_turn must be >= 1")


STALE_GROUPS = ("pace", "drop")


def rerun_seed(seed: int, attempt: int) -> int:
    """The episode seed of the ``attempt``-th run of an episode (a new sample, still reproducible)."""
    return (seed * 1_000_003 + attempt * 999_983) % (2**62)


@dataclass
class EpisodeLengths:
    """Tokens of the episodes that finished and of those the learner took, summed since the run (this process)
    started: whether training keeps long episodes at their share (dropping stale groups loses them)."""

    finished_episodes: int = 0
    finished_tokens: int = 0
    trained_episodes: int = 0
    trained_tokens: int = 0

    def finished(self, trajs: list[Trajectory]) -> None:
        """Count the trajectories of a group that just finished."""
        self.finished_episodes += len(trajs)
        self.finished_tokens += sum(len(t.tokens) for t in trajs)

    def trained(self, trajs: list[Trajectory]) -> None:
        """Count the trajectories of a batch the learner took."""
        self.trained_episodes += len(trajs)
        self.trained_tokens += sum(len(t.tokens) for t in trajs)

    def metrics(self) -> dict[str, float]:
        """episode_tokens_mean_{finished,trained} (NaN before any) and their ratio trained / finished."""
        fin = self.finished_tokens / self.finished_episodes if self.finished_episodes else math.nan
        tr = self.trained_tokens / self.trained_episodes if self.trained_episodes else math.nan
        return {
            "episode_tokens_mean_finished": fin,
            "episode_tokens_mean_trained": tr,
            "episode_tokens_trained_over_finished": tr / fin if fin == fin and tr == tr and fin else math.nan,
        }


class RolloutFailure(RuntimeError):
    """Every recent episode failed; the run cannot make progress."""


class RolloutDeadlock(RuntimeError):
    """The learner waits for groups that admission will never start (a broken resume state)."""


class RolloutController:
    """Owns the episodes in flight, the env pool and the trajectory queue."""

    def __init__(
        self,
        engine,
        env_factory: Callable[[], Any],
        template,
        tokenizer,
        tasks: TaskSource,
        cfg: RolloutConfig,
        *,
        lag: LagPolicy,
        sampling: SamplingSpec,
        runner: EpisodeRunner | None = None,
    ) -> None:
        """``lag`` and ``sampling``: the run's lag policy and sampling distribution (``runtime.plan``), the
        same objects the learner follows. ``self.lag`` is the run's one ``LagBound`` over that policy (the
        governor's moving bound included): admission, the queue's stale drop and the loop read it.
        ``runner`` drives each episode (rollout/episode_runner.py; default: the agent loop); a runner that
        uses no env (``uses_env`` False) is given None and ``env_factory`` is never called."""
        cfg.validate()
        self.engine = engine
        self.env_factory = env_factory
        self.runner: EpisodeRunner = runner if runner is not None else AgentLoop()
        self.template = template
        self.tokenizer = tokenizer
        self.tasks = tasks
        self.cfg = cfg
        self.lag = LagBound(lag, cfg.stale_groups)
        self.sampling = sampling
        self._request = SamplingParams.from_spec(sampling)  # the template; run_episode sets the rest per turn
        self.queue = TrajectoryQueue()
        self.ledger = GroupLedger(self.queue)  # where every started group is, the counters, steps done
        self._idle_envs: list[Any] = []
        self._all_envs: list[Any] = []
        self._executor = ThreadPoolExecutor(
            max_workers=cfg.max_concurrent_episodes, thread_name_prefix="rz-env"
        )
        self._slots = asyncio.Semaphore(cfg.max_concurrent_episodes)
        self._admission = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._consecutive_failures = 0
        self.failure: RolloutFailure | None = None  # set when the run must stop; next_batch raises it
        self.first_error: str | None = None  # the run's first failed episode, for the summary
        # Pacing (rollout.stale_groups: pace): the learner's version as the loop last told it (next_batch,
        # step_done), and for each group in flight the version it was admitted at, a lower bound of its
        # oldest token's version (the engine samples with the weights published by then, or newer ones).
        self.learner_version = 0
        self._admitted_at: dict[int, int] = {}
        self.episode_lengths = EpisodeLengths()  # tokens of finished and of trained episodes
        # The batches the run trains in all (the loop sets its ``steps``): admission starts no group past
        # them, so the last steps do not pay for rollouts that no step will train. None: no end.
        self.last_batch: int | None = None

    # ---- the ledger's figures, as callers read them -------------------------------------------------
    @property
    def counters(self) -> Counters:
        """The rollout counters by name (``groups_started``, ...): the ledger's, read and written through."""
        return self.ledger.counters

    @property
    def steps_done(self) -> int:
        """Finished learner steps (``step_done`` calls, and those of the checkpoint resumed from)."""
        return self.ledger.steps_done

    @property
    def in_flight(self) -> dict[int, Any]:
        """Group index -> task of the groups whose episodes are running."""
        return self.ledger.in_flight

    @property
    def _relaunch(self) -> list[tuple[int, Any]]:  # the groups still to relaunch after a resume
        return self.ledger.relaunch

    # ---- admission ------------------------------------------------------------------------------
    def may_start_group(self) -> bool:
        """True while starting one more group keeps the lag bound (see the module docstring); when pacing,
        also while no group in flight would be past the admission bound after the next step."""
        batches = self.steps_done + self.lag.ahead_batches()
        if self.last_batch is not None:
            batches = min(batches, self.last_batch)
        if self.ledger.live >= batches * self.cfg.groups_per_batch:
            return False
        return not (self.lag.paced and self._oldest_in_flight_lag(1) > self.lag.admission)

    def _oldest_in_flight_lag(self, steps_ahead: int) -> int:
        """The lag the oldest group in flight will have (at most) ``steps_ahead`` learner steps from now; -1
        when none is in flight."""
        if not self._admitted_at:
            return -1
        return self.learner_version + steps_ahead - min(self._admitted_at.values())

    def _wake(self) -> None:
        self._admission.set()

    # ---- producing ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Start groups as admission allows, until ``stop``."""
        try:
            while not self._stopping:
                # No await from here to the in_flight entry (relaunch_next / start): a checkpoint always finds
                # the group somewhere.
                relaunched = self.ledger.relaunch_next()
                if relaunched is not None:
                    index, task = relaunched
                elif self.may_start_group():
                    task = self.tasks.next()
                    index = self.ledger.start(task)
                else:
                    self._admission.clear()
                    await self._admission.wait()
                    continue
                self._admitted_at[index] = self.learner_version
                members = []
                for m in range(self.cfg.group_size):
                    await self._slots.acquire()
                    spec = EpisodeSpec(task, index, m, self._episode_seed(index, m), self._reset_seed(index))
                    members.append(asyncio.ensure_future(self._episode(spec)))
                t = asyncio.ensure_future(self._finish_group(index, members))
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)
        finally:
            await self._cancel_all()

    def _episode_seed(self, group: int, member: int) -> int:
        return (self.cfg.seed * 1_000_000_007 + group * 1009 + member) % (2**62)

    def _reset_seed(self, group: int) -> int:
        """One env.reset seed per group: an env drawing its own task poses it to every member."""
        return (self.cfg.seed * 999_999_937 + group * 7919 + 13) % (2**62)

    async def _episode(self, spec: EpisodeSpec) -> Trajectory | None:
        env = self._idle_envs.pop() if self._idle_envs else None
        self.ledger.episodes_started += 1
        try:
            if env is None and self.runner.uses_env:
                env = await asyncio.get_running_loop().run_in_executor(self._executor, self.env_factory)
                self._all_envs.append(env)
            traj = await self._run_with_reruns(spec, env)
            self.ledger.episodes_finished += 1
            self._consecutive_failures = 0
            if env is not None:
                self._idle_envs.append(env)
            return traj
        except asyncio.CancelledError:
            raise
        except (EpisodeError, Exception) as e:  # one bad episode never stops the run
            self.ledger.episodes_failed += 1
            if isinstance(e, InfraFailure):  # masked: out of the group's baseline and the loss, not scored
                self.ledger.infra_failed += 1
            where = f"group {spec.group_id}, member {spec.member}"
            first = self.first_error is None
            if first:
                self.first_error = f"{e} ({where})"
            # the first failure with its traceback (the env's own frames, through ``raise ... from``)
            log.warning("episode (%s) dropped: %s", where, e, exc_info=e if first else None)
            self._consecutive_failures += 1
            limit = self.cfg.max_consecutive_failures
            if limit and self._consecutive_failures >= limit and self.failure is None:
                self.failure = RolloutFailure(f"{limit} episodes in a row failed; the last one: {e}")
                self.failure.__cause__ = e  # rz.log shows the episode's traceback under the failure's
                self.stop()
                self.queue.wake()
            if env is not None:  # it may be broken: do not reuse it
                self._close_env(env)
            return None
        finally:
            self._slots.release()

    async def _run_with_reruns(self, spec: EpisodeSpec, env) -> Trajectory:
        """The runner's episode; if infrastructure loses it (InfraFailure: its engine replica or env worker
        died, its sandbox was gone), run it again (same task, new seed).

        A lost run leaves nothing behind: a trajectory exists only once an episode has run to its end.
        """
        for attempt in itertools.count():
            try:
                return await self.runner.run_episode(
                    self.engine,
                    env,
                    self.template,
                    self.tokenizer,
                    spec if attempt == 0 else dataclasses.replace(spec, seed=rerun_seed(spec.seed, attempt)),
                    self._request,
                    self.cfg.limits,
                    self._executor,
                    self.cfg.infra_exceptions,
                )
            except InfraFailure:
                if attempt >= self.cfg.max_episode_reruns:
                    self.ledger.episodes_lost += 1
                    raise
                self.ledger.episodes_rerun += 1
        raise AssertionError("unreachable")

    async def _finish_group(self, index: int, members: list[asyncio.Future]) -> None:
        results = await asyncio.gather(*members)
        if self._stopping:  # the run is ending: the group stays in flight (a resume runs it again), so the
            return  # accounting the last step logged is the final checkpoint's
        # Members that failed (infrastructure included) are not in the group: its baseline is the mean over
        # the members that ran to their end, and the loss has no row for the others.
        trajs = [t for t in results if t is not None]
        self._admitted_at.pop(index, None)
        self.episode_lengths.finished(trajs)
        if trajs and self._replace_uniform(trajs):
            self.ledger.drop_uniform(index)
            self._wake()  # admission starts a replacement
            self.queue.notify()
        elif trajs:
            self.ledger.finish(index, trajs)
        else:
            self.ledger.drop_failed(index)
            self._wake()
            self.queue.notify()  # a waiting next_batch re-checks whether any group can still come

    def _replace_uniform(self, trajs: list[Trajectory]) -> bool:
        """Whether to drop this finished group and start another: its rewards are all equal and the
        oversample budget (``oversample`` per learner step, counted from the first) is not spent."""
        if not self.cfg.oversample or len({float(t.reward) for t in trajs}) != 1:
            return False
        return self.ledger.groups_dropped_uniform < (self.ledger.steps_done + 1) * self.cfg.oversample

    # ---- consuming ------------------------------------------------------------------------------
    async def next_batch(self, version: int) -> list[Trajectory]:
        """Wait for groups_per_batch groups trainable at ``version``; return their trajectories."""

        def on_drop(groups: list[Group]) -> None:
            self.ledger.drop_stale(groups)
            self._wake()

        if self.failure is not None:
            raise self.failure
        self.learner_version = version
        groups = await self.queue.take(
            self.cfg.groups_per_batch,
            version,
            self.lag.train,
            on_drop,
            check=self._check_not_deadlocked,
            oldest_first=self.lag.paced,
            wait=self._must_wait if self.lag.paced else None,
        )
        if self.failure is not None:
            raise self.failure
        self.ledger.take(groups)
        self.episode_lengths.trained([t for g in groups for t in g.trajectories])
        # Group order (not completion order) fixes the summation order of the loss: reproducible steps.
        return [t for g in sorted(groups, key=lambda g: g.index) for t in g.trajectories]

    def _must_wait(self) -> bool:
        """Pacing: whether the learner must wait for a group in flight instead of training the batch it could
        take now. That batch's step makes the version ``learner_version + 1``; a group still in flight is
        trained at that version or later, so the step may run only while every group in flight stays within
        max_lag of it. Once the oldest finishes, it is queued and taken first (oldest_first)."""
        return self._oldest_in_flight_lag(1) > self.lag.hard

    def _check_not_deadlocked(self) -> None:
        """Raise RolloutDeadlock if the batch next_batch waits for can never be filled.

        Nothing can change while no group is in flight or waiting for relaunch, no taken batch awaits its
        step_done (which would admit more) and admission is closed: waiting would be forever.
        """
        if self.ledger.pending or self._stopping or self.may_start_group():
            return
        c = self.counters
        ahead = self.lag.ahead_batches()
        raise RolloutDeadlock(
            f"the learner waits for {self.cfg.groups_per_batch} groups but none can come: {len(self.queue)} "
            f"queued, 0 in flight, and admission is closed (live groups {self.ledger.live}"
            f" = started {c['groups_started']} - dropped {self.ledger.dropped} >= (steps_done "
            f"{self.steps_done} + ahead {ahead}) x {self.cfg.groups_per_batch}; trained "
            f"{c['groups_trained']}). The controller "
            "state (a checkpoint?) does not account for every started group."
        )

    def publish(self, weights, version: int) -> None:
        """Send new weights to the engine (episodes in flight continue with them)."""
        self.engine.load_weights(weights, version)

    def step_done(self, version: int | None = None) -> None:
        """The learner finished a step (applied or skipped) on the oldest taken batch: admit the next groups.
        ``version``: the learner's version after it (pacing counts lags from it; None keeps the last one)."""
        if version is not None:
            self.learner_version = version
        self.ledger.step_done()
        self._wake()
        self.queue.notify()

    # ---- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A consistent cut: data position, counters, queued trajectories and the groups to relaunch.

        Batches taken by the learner but not yet trained (``step_done``) are saved as queued, in front.
        """
        return {"format": STATE_FORMAT, "tasks": self.tasks.state_dict(), **self.ledger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state of the current format (checkpoint_cut.upgrade_state converts older ones); groups
        that were in flight are run again first (same index, task and seeds). Raises InconsistentCheckpoint
        (naming the counts), changing nothing, if the state is not a consistent cut."""
        ledger = GroupLedger.from_state(state)
        ledger.check(
            ledger.steps_done, task_position=int(state["tasks"]["position"]), where="controller state"
        )
        self.tasks.load_state_dict(state["tasks"])
        self.ledger, self.queue = ledger, ledger.queue

    # ---- shutdown ---------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask ``run`` to return; episodes in flight are cancelled."""
        self._stopping = True
        self._wake()

    async def _cancel_all(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _close_env(self, env) -> None:
        try:
            env.close()
        except Exception as e:  # closing is best effort
            log.warning("env.close failed: %r", e)

    def close(self) -> None:
        """Close every env and the env thread pool."""
        for env in self._all_envs:
            self._close_env(env)
        self._all_envs.clear()
        self._idle_envs.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
