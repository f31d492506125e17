"""The GroupLedger: every started group in exactly one place (in flight, queued, taken, trained, dropped),
moved only by its transitions, saved as a consistent cut and checked by one method on save and load."""

import asyncio
import pickle

import pytest

from rz_agents.rollout.checkpoint_cut import check_consistent_cut, upgrade_state
from rz_agents.rollout.controller import RolloutConfig, RolloutController
from rz_agents.rollout.group_ledger import COUNTERS, STATE_FORMAT, GroupLedger, InconsistentCheckpoint
from rz_agents.rollout.lag_policy import LagPolicy
from rz_agents.rollout.task_source import TaskSource
from rz_agents.sampling import SamplingSpec
from rz_agents.trajectory import Trajectory


def _traj(group: int, version: int = 0, reward: float = 1.0) -> Trajectory:
    return Trajectory(
        [1, 2, 3], [False, True, True], [0.0, -0.5, -0.25], [-1, version, version], reward, group
    )


def _ledger_through_every_place() -> tuple[GroupLedger, list[list[int]]]:
    """Eight groups: 0-1 trained, 2-3 taken, 4 queued, 5 dropped (failed), 6 dropped (uniform), 7 in
    flight."""
    led = GroupLedger()
    for i in range(8):
        assert led.start({"task": i}) == i
    for i in (0, 1, 2, 3, 4):
        led.finish(i, [_traj(i), _traj(i)])
    led.drop_failed(5)
    led.drop_uniform(6)
    led.take(_take(led, 2))
    led.step_done()
    led.take(_take(led, 2))
    return led, [[0, 1]]


def _take(led: GroupLedger, n: int):
    """The next ``n`` queued groups, as the controller's ``next_batch`` takes them from the queue."""
    return asyncio.run(led.queue.take(n, version=0, max_lag=0, on_drop=led.drop_stale))


def test_each_transition_moves_a_group_from_one_place_to_the_next_and_the_ledger_stays_consistent():
    led = GroupLedger()
    assert (led.start("a"), led.start("b"), led.start("c")) == (0, 1, 2)
    assert led.in_flight == {0: "a", 1: "b", 2: "c"} and led.live == 3 and led.pending
    led.check(steps=0, trained_groups=[], task_position=3)

    led.finish(0, [_traj(0)])
    led.finish(1, [_traj(1)])
    led.drop_failed(2)
    assert list(led.in_flight) == [] and len(led.queue) == 2
    assert (led.groups_finished, led.groups_dropped_failed, led.dropped, led.live) == (2, 1, 1, 2)
    assert led.dropped_indices == [2]
    led.check(steps=0, trained_groups=[], task_position=3)

    led.take(_take(led, 2))
    assert led.pending and led.groups_trained == 0
    led.check(steps=0, trained_groups=[], task_position=3)  # a taken batch counts as queued
    led.step_done()
    assert (led.steps_done, led.groups_trained, led.pending) == (1, 2, False)
    led.check(steps=1, trained_groups=[[0, 1]], task_position=3)


def test_a_stale_group_the_queue_drops_is_recorded_as_dropped_with_its_index():
    led = GroupLedger()
    for task in (None, None, None):
        led.start(task)
    led.finish(0, [_traj(0, version=0)])
    led.finish(1, [_traj(1, version=5)])
    led.finish(2, [_traj(2, version=6)])
    batch = asyncio.run(led.queue.take(2, version=6, max_lag=2, on_drop=led.drop_stale))
    led.take(batch)
    assert [g.index for g in batch] == [1, 2]
    assert (led.groups_dropped_stale, led.dropped_indices, led.live) == (1, [0], 2)
    led.step_done()
    led.check(steps=1, trained_groups=[[1, 2]], task_position=3)


def test_step_done_without_a_taken_batch_is_an_error_and_changes_nothing():
    led = GroupLedger()
    with pytest.raises(RuntimeError, match=r"step_done\(\) without a batch taken by next_batch\(\)"):
        led.step_done()
    assert (led.steps_done, led.groups_trained) == (0, 0)


def test_the_counters_read_and_write_through_to_the_ledger_in_the_saved_order():
    led = GroupLedger()
    led.start(None)
    led.episodes_started += 2
    c = led.counters
    assert list(c) == list(COUNTERS) and c["groups_started"] == 1 and c["episodes_started"] == 2
    c["groups_started"] += 4
    assert led.groups_started == 5 and dict(c)["groups_started"] == 5
    with pytest.raises(KeyError, match="'groups_lost' is not a rollout counter"):
        c["groups_lost"] = 1


def test_state_dict_round_trips_and_saves_taken_batches_as_queued_in_front():
    led, trained = _ledger_through_every_place()
    state = {"format": STATE_FORMAT, "tasks": {"position": 8}, **led.state_dict()}
    assert [g["index"] for g in state["queued"]] == [2, 3, 4]
    assert state["in_flight"] == [(7, {"task": 7})]
    assert state["dropped_groups"] == [5, 6] and state["steps_done"] == 1
    assert list(state["counters"]) == list(COUNTERS)

    back = GroupLedger.from_state(state)
    assert [i for i, _ in back.relaunch] == [7] and not back.in_flight and len(back.queue) == 3
    assert back.relaunch_next() == (7, {"task": 7}) and back.in_flight == {7: {"task": 7}}
    assert back.groups_started == 8  # a relaunched group was started before: not counted again
    back.check(steps=1, trained_groups=trained, task_position=8)
    again = {"format": STATE_FORMAT, "tasks": {"position": 8}, **back.state_dict()}
    assert pickle.dumps(again) == pickle.dumps(state)  # the saved form is unchanged by a load
    check_consistent_cut(state, 1, trained)


def test_a_group_in_two_places_is_an_inconsistent_checkpoint_naming_both():
    led, trained = _ledger_through_every_place()
    led.dropped_indices[0] = 4  # group 4 is queued; record it as dropped instead of 5
    with pytest.raises(
        InconsistentCheckpoint,
        match=r"inconsistent checkpoint \(saving\): 1 group indices are in more than one place: "
              r"4 \(queued \+ dropped\)",
    ):
        led.check(steps=1, trained_groups=trained, task_position=8, where="saving")


def test_a_started_group_in_no_place_is_an_inconsistent_checkpoint():
    led, trained = _ledger_through_every_place()
    led.start(None)
    del led.in_flight[8]  # started, then lost track of (what the old checkpoints did)
    with pytest.raises(InconsistentCheckpoint, match=r"groups_started 9 != trained 2 \+ .*\(= 8\)"):
        led.check(steps=1, trained_groups=trained, task_position=9)


def test_a_trained_batch_recorded_with_the_wrong_groups_is_named():
    led, _ = _ledger_through_every_place()
    with pytest.raises(InconsistentCheckpoint, match=r"in more than one place: 2 \(queued \+ trained\)$"):
        led.check(steps=1, trained_groups=[[0, 2]], task_position=8)  # 2 is taken (saved as queued)
    with pytest.raises(
        InconsistentCheckpoint, match=r"group indices outside range\(groups_started=8\): \[9\]"
    ):
        led.check(steps=1, trained_groups=[[0, 9]], task_position=8)


def test_counts_that_disagree_are_named_with_their_figures():
    led, trained = _ledger_through_every_place()
    led.groups_started += 1  # a phantom group: started, and in no place
    with pytest.raises(InconsistentCheckpoint) as e:
        led.check(steps=2, trained_groups=trained, task_position=8)
    msg = str(e.value)
    assert "steps_done 1 != 2 learner steps in the history" in msg
    expected = (
        "groups_started 9 != trained 2 + queued 3 + in flight 1 + dropped 1 failed + 0 stale "
        "+ 1 uniform (= 8)"
    )
    assert expected in msg
    assert "task position 8 != groups_started 9" in msg
    assert "1 trained batches recorded != 2 steps" in msg
    led.groups_started -= 1
    led.groups_dropped_stale += 1
    with pytest.raises(
        InconsistentCheckpoint, match=r"2 dropped group indices != dropped 1 \+ 1 \+ 1 uniform"
    ):
        led.check(steps=1, trained_groups=trained, task_position=8)


def test_an_old_format_state_is_upgraded_and_its_unknown_dropped_indices_stay_unknown():
    led, _ = _ledger_through_every_place()
    v1 = {"tasks": {"position": 8}, **led.state_dict(), "steps_done": 0}  # format 1: steps_done lagged
    del v1["dropped_groups"], v1["counters"]["groups_trained"]
    with pytest.raises(ValueError, match="controller state of format 1, expected 2 .*upgrade_state"):
        GroupLedger.from_state(v1)
    state = upgrade_state(v1, steps=1, groups_per_batch=2)
    assert state["format"] == STATE_FORMAT and state["dropped_groups"] is None
    old = GroupLedger.from_state(state)
    assert not old.dropped_indices_known and (old.steps_done, old.groups_trained) == (1, 2)
    old.check(steps=1, task_position=8)
    check_consistent_cut(state, 1, [[0, 1]])  # counts checked; the partition needs the dropped indices
    old.relaunch_next()
    old.drop_failed(7)
    assert old.dropped_indices == [] and old.state_dict()["dropped_groups"] is None
    old.groups_started += 1
    with pytest.raises(InconsistentCheckpoint, match=r"groups_started 9 != trained 2 \+ queued 3"):
        old.check(steps=1, task_position=9)


def test_a_state_with_an_unknown_counter_is_a_clear_error():
    led, _ = _ledger_through_every_place()
    state = {"format": STATE_FORMAT, "tasks": {"position": 8}, **led.state_dict()}
    state["counters"]["groups_lost"] = 3
    with pytest.raises(ValueError, match=r"unknown counters \['groups_lost'\]"):
        GroupLedger.from_state(state)


def test_the_controller_refuses_an_inconsistent_state_and_keeps_its_own():
    controller = RolloutController(
        None,
        lambda: None,
        None,
        None,
        TaskSource(None),
        RolloutConfig(),
        lag=LagPolicy(),
        sampling=SamplingSpec(),
    )
    try:
        led, _ = _ledger_through_every_place()
        state = {"format": STATE_FORMAT, "tasks": {"position": 8}, **led.state_dict()}
        state["counters"]["groups_started"] = 10
        with pytest.raises(
            InconsistentCheckpoint, match=r"\(controller state\): groups_started 10 != trained 2"
        ):
            controller.load_state_dict(state)
        assert controller.tasks.position == 0 and len(controller.queue) == 0 and controller.steps_done == 0
        assert controller.counters["groups_started"] == 0 and not controller._relaunch

        state["counters"]["groups_started"] = 8
        controller.load_state_dict(state)
        assert controller.tasks.position == 8 and len(controller.queue) == 3 and controller.steps_done == 1
        assert controller.queue is controller.ledger.queue
        assert controller.state_dict() == state
    finally:
        controller.close()
