"""Images in chat messages (content parts) and in trajectories (PNG bytes): the shapes checked, the
pixels kept exactly through every way a trajectory travels."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from rz_agents.envs.base import ChatMessages, as_messages
from rz_agents.images import (
    content_text,
    from_png,
    image_part,
    message_images,
    text_part,
    to_png,
)
from rz_agents.trajectory import Trajectory, TrajectoryError


def _noise(w: int = 32, h: int = 24, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _trajectory(images: list[bytes]) -> Trajectory:
    return Trajectory([1, 2, 3], [False, True, True], [0.0, -0.5, -1.0], [-1, 0, 0], 1.0, 7, {}, images)


def test_messages_with_image_parts_pass_the_contract_and_keep_their_images():
    img = Image.fromarray(_noise())
    msg = {"role": "user", "content": [text_part("look:"), image_part(img), image_part(_noise(seed=1))]}
    (out,) = as_messages([msg])
    assert out["content"] is not msg["content"] and out["content"] == msg["content"]  # a copy, same parts
    assert ChatMessages().contains([msg]) and content_text(out["content"]) == "look:"
    assert message_images([msg, {"role": "user", "content": "text"}])[0] is img


@pytest.mark.parametrize(
    "content, match",
    [
        ([{"type": "image_url", "image_url": "x.png"}], r"content\[0\] must be a dict with type in"),
        ([{"type": "image", "image": "x.png"}], r"content\[0\] is an image part whose 'image' is str"),
        ([text_part("a"), {"type": "text", "text": 3}], r"content\[1\] is a text part without a str"),
        ([{"type": "image", "image": np.zeros((4, 4), np.uint8)}], r"not a PIL image or HxWx3 uint8"),
        (5, "must be a str or a list of content parts, got int"),
    ],
)
def test_bad_content_is_refused_naming_the_part(content, match):
    with pytest.raises(ValueError, match=match):
        as_messages([{"role": "user", "content": content}])
    assert not ChatMessages().contains([{"role": "user", "content": content}])


def test_png_round_trip_is_exact_and_non_png_is_refused():
    arr = _noise(45, 17)
    assert np.array_equal(np.asarray(from_png(to_png(arr))), arr)
    assert np.array_equal(np.asarray(from_png(to_png(Image.fromarray(arr).convert("RGBA")))), arr)
    with pytest.raises(ValueError, match="not PNG bytes"):
        from_png(b"GIF89a....")


def test_trajectory_images_survive_dict_pickle_and_torch_save():
    pngs = [to_png(_noise(seed=s)) for s in range(3)]
    traj = _trajectory(pngs)
    traj.validate()
    copies = [Trajectory.from_dict(traj.to_dict()), pickle.loads(pickle.dumps(traj))]
    buf = io.BytesIO()
    torch.save({"t": traj.to_dict()}, buf)
    buf.seek(0)
    copies.append(Trajectory.from_dict(torch.load(buf, weights_only=False)["t"]))
    for c in copies:
        assert c == traj and [np.asarray(from_png(b)).tobytes() for b in c.images] == [
            np.asarray(from_png(b)).tobytes() for b in pngs
        ]
    # (to_dict/from_dict is how the controller's checkpointed queue stores them; pickle is Ray's and the
    # learner process's way) -- a dict written before the field existed has no images
    old = traj.to_dict()
    del old["images"]
    assert Trajectory.from_dict(old).images == []


def test_a_trajectory_with_something_else_than_png_bytes_is_invalid():
    with pytest.raises(TrajectoryError, match=r"images\[1\] is not PNG bytes \(str\)"):
        _trajectory([to_png(_noise()), "x.png"]).validate()
    with pytest.raises(TrajectoryError, match=r"images\[0\] is not PNG bytes \(b'GIF89a"):
        _trajectory([b"GIF89a-----"]).validate()
