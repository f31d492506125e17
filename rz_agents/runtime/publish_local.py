"""The in-process weight transport: the engine lives in this process and copies the record's tensors in."""

from __future__ import annotations

from typing import Any

from rz_agents.model.weight_update import WeightUpdate


class InProcessPublisher:
    """Publishes ``WeightUpdate`` records to an engine in this process (``RZEngine.apply_update``).

    ``learner``: the learner (or its child-process proxy), which makes the record (``weight_update``)."""

    def __init__(self, engine: Any, learner: Any) -> None:
        self.engine = engine
        self.learner = learner
        self.last_bytes = 0  # bytes of the latest update sent (with LoRA: the adapters')

    def current(self) -> WeightUpdate:
        """The learner's current record (LoRA: the adapters only; freeze_vision: all but the tower)."""
        return self.learner.weight_update()

    def whole(self) -> WeightUpdate:
        """The learner's whole weights as a record (no held part: an engine takes it whatever it holds)."""
        return WeightUpdate(self.learner.version, self.learner.weights())

    def current_is_partial(self) -> bool:
        """True when the learner's updates leave a frozen part out (the engine needs ``whole`` first)."""
        return self.learner.published_names() is not None

    @staticmethod
    def snapshot(update: WeightUpdate) -> WeightUpdate:
        """An unchanging copy for the fixed-lag history (the learner's tensors change in place)."""
        return update.snapshot()

    def publish(self, update: WeightUpdate) -> None:
        """The engine applies ``update`` between its steps (episodes in flight continue with it)."""
        self.engine.apply_update(update)
        self.last_bytes = update.nbytes
