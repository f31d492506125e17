"""Trajectory segments (an agent that compacted its history): where they start, what validate refuses."""

import pytest

from rz_agents.trajectory import Trajectory, TrajectoryError


def _traj(segment_starts, mask=None):
    mask = mask or [False, True, False, True, False, False, True, True]
    return Trajectory(
        tokens=list(range(8)),
        loss_mask=mask,
        behavior_logprobs=[-0.5 if m else 0.0 for m in mask],
        versions=[0 if m else -1 for m in mask],
        reward=1.0,
        group_id=0,
        segment_starts=segment_starts,
    )


def test_segments_cover_the_tokens_in_order_and_survive_a_dict_round_trip():
    t = _traj([4])
    t.validate()
    assert t.segments() == [(0, 4), (4, 8)]
    assert Trajectory.from_dict(t.to_dict()).segment_starts == [4]
    assert _traj([]).segments() == [(0, 8)]


@pytest.mark.parametrize(
    "starts, why",
    [([3], "cannot be sampled"), ([5, 4], ">= 2 tokens"), ([7], ">= 2 tokens"), ([9], ">= 2 tokens")],
)
def test_segments_that_do_not_fit_are_refused(starts, why):
    with pytest.raises(TrajectoryError, match=why):
        _traj(starts).validate()


def test_segments_with_images_are_refused_at_their_producer_with_the_reason():
    import numpy as np

    from rz_agents.images import to_png

    picture = to_png(np.zeros((4, 4, 3), dtype=np.uint8))
    t = _traj([4])
    t.images = [picture]
    with pytest.raises(TrajectoryError, match="both images and history segments .* not supported yet"):
        t.validate()
    t.segment_starts = []
    t.validate()  # images without segments, or segments without images, are fine
