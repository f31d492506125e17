"""A decode-graph capture survives a learner stepping in another thread (issue 54). With ``runtime: local``
the learner runs in a thread of the engine's process; CUDA's default ("global") capture mode lets any thread's
unsafe call (an allocation, a sync) invalidate the capture, so a learner step during a lazy capture turned
CUDA graphs off (or failed the learner). The capture now runs in thread-local mode.

No GPU on CI: ``torch.cuda``'s capture entry points are replaced by a fake that keeps CUDA's contract for
another thread's call during a capture (an error in "global" mode, none in "thread_local" or "relaxed"),
and a learner thread allocates while the capture is open. Before the fix the capture raised here."""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace

import pytest
import torch

from rz_agents.engine import cuda_graphs
from rz_agents.engine.cuda_graphs import DecodeGraphs


class _FakeCapture:
    """``torch.cuda.graph`` as CUDA's stream-capture modes define it for other threads' unsafe calls."""

    log: list[str] = []

    def __init__(self, graph, pool=None, stream=None, capture_error_mode: str = "global") -> None:
        self.mode = capture_error_mode

    def __enter__(self):
        self.log.append(self.mode)
        called = threading.Event()

        def learner_step():  # what the learner thread does meanwhile: allocate (cudaMalloc), then sync
            called.set()

        worker = threading.Thread(target=learner_step)
        worker.start()
        worker.join()
        self.other_thread_called = called.is_set()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None and self.mode == "global" and self.other_thread_called:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")


class _FakeStream:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass


def _fake_step(model: torch.nn.Module):
    """What DecodeGraphs reads of a DecodeStep: a CUDA-resident cache, bounds, buffers and the forward."""
    calls = []

    def forward(buf, max_position, positions):
        calls.append(max_position)
        return model(torch.zeros(buf.batch, 4))

    return SimpleNamespace(
        cache=SimpleNamespace(device=torch.device("cuda")),
        model=model,
        static_max_position=511,
        graph_bounds=lambda: [511],
        buffers=lambda bucket: SimpleNamespace(batch=bucket),
        fill_padding=lambda buf: None,
        forward=forward,
        calls=calls,
    )


@pytest.fixture
def fake_cuda_capture(monkeypatch):
    _FakeCapture.log = []
    monkeypatch.setattr(torch.cuda, "graph", _FakeCapture)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: SimpleNamespace(replay=lambda: None))
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    return _FakeCapture


def test_a_capture_is_not_broken_by_a_learner_thread_calling_cuda_meanwhile(fake_cuda_capture):
    step = _fake_step(torch.nn.Linear(4, 4))
    graphs = DecodeGraphs(step)
    graphs.capture(4)  # raised "operation not permitted when stream is capturing" in global mode
    assert graphs.captures == 1 and graphs.captured == [4]
    assert fake_cuda_capture.log == ["thread_local"] == [cuda_graphs.CAPTURE_ERROR_MODE]


def test_the_fake_breaks_a_global_mode_capture_as_cuda_does(fake_cuda_capture, monkeypatch):
    # the negative control: the mode before issue 54 fails under the same learner thread
    monkeypatch.setattr(cuda_graphs, "CAPTURE_ERROR_MODE", "global")
    graphs = DecodeGraphs(_fake_step(torch.nn.Linear(4, 4)))
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        graphs.capture(4)
    assert graphs.captures == 0
