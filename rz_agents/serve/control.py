"""The RL control API: pause / resume generation, a versioned weight update, the current version.

The engine's own methods (``RZEngine.pause_generation``, ``resume_generation``, ``load_weights``,
``version``) are the Python API; ``RLControl`` gathers them for a trainer that drives a server, and
``add_control_routes`` exposes them over HTTP under the names vLLM's RL endpoints use (docs/serve.md has
the table side by side):

    POST /pause?mode=abort|wait|keep     POST /resume          GET /is_paused
    POST /update_weights {"path": DIR_OR_FILE, "version": V}   GET /weight_version

The routes are mounted only when asked for (``create_app(..., control=RLControl(...))``, ``rz serve
--control``) and answer only to the control key (guard.py): never on the server an agent under training
talks to. A version is an int64 that never goes back; a path that cannot be loaded gets one answer whatever
the reason (missing, a directory without weights, a file that is not a state dict), so the route tells
nothing about the file system, and with ``weights_dir`` only paths under it are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from fastapi import Request

from rz_agents.engine.pause import PAUSE_MODES
from rz_agents.serve.json_body import read_json
from rz_agents.serve.openai_schema import OpenAIError

MAX_VERSION = 2**63 - 1  # versions travel as int64 (trajectories, the learner's tensors)


class RLControl:
    """Pause, resume and versioned weight updates of one engine (call from the engine's event loop).

    ``weights_dir``: when set, ``update_weights_from_path`` reads only paths inside it.
    """

    def __init__(self, engine, weights_dir: str | Path | None = None) -> None:
        self.engine = engine
        self.weights_dir = Path(weights_dir).resolve() if weights_dir is not None else None

    async def pause(self, mode: str = "abort") -> None:
        """Pause generation; ``mode``: "abort" (finish requests in flight now, with their partial output),
        "wait" (let them finish first) or "keep" (freeze them until ``resume``)."""
        if mode not in PAUSE_MODES:
            raise OpenAIError(f"'mode' must be one of {PAUSE_MODES}, got {mode!r}", "mode")
        await self.engine.pause_generation(mode)

    def resume(self) -> None:
        """Resume generation (frozen and queued requests continue)."""
        self.engine.resume_generation()

    @property
    def is_paused(self) -> bool:
        return self.engine.is_paused

    @property
    def version(self) -> int:
        """The policy version of the weights the engine samples with."""
        return self.engine.version

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> int:
        """Load ``state`` (parameter name -> tensor, any subset) as policy ``version``; tokens sampled from
        now on carry it. Refuses a version older than the current one (a stale publication)."""
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
            raise OpenAIError(f"'version' must be an integer in [0, 2**63 - 1], got {version!r}", "version")
        if version < self.engine.version:
            raise OpenAIError(
                f"'version' {version} is older than the engine's current version {self.engine.version}",
                "version",
                status=409,
            )
        try:
            self.engine.load_weights(state, version)
        except ValueError as e:
            raise OpenAIError(f"the weights do not fit the model: {e}", "path") from e
        return self.engine.version

    def update_weights_from_path(self, path: str, version: int) -> int:
        """``update_weights`` from an HF checkpoint directory, a .safetensors file or a torch state-dict
        file (inside ``weights_dir`` when set)."""
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
            raise OpenAIError(f"'version' must be an integer in [0, 2**63 - 1], got {version!r}", "version")
        p = Path(path).resolve()
        if self.weights_dir is not None and not p.is_relative_to(self.weights_dir):
            raise _unreadable(path)
        return self.update_weights(read_state(str(p)), version)


def _unreadable(path: str) -> OpenAIError:
    return OpenAIError(
        f"cannot load weights from {path!r} (an HF checkpoint directory, a .safetensors file or a .pt state "
        "dict of tensors, readable by the server and inside its weights directory if it has one)",
        "path",
    )


def read_state(path: str) -> Mapping[str, torch.Tensor]:
    """Tensors by name from an HF checkpoint directory (safetensors shards), a .safetensors file or a .pt
    state dict; one OpenAIError (400) naming only the path when it is none of these, whatever the reason
    (the reason would describe the file)."""
    p = Path(path)
    try:
        if p.is_dir():
            from rz_agents.model.checkpoint import LazyState

            state = dict(LazyState(p))
        elif p.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(p))
        else:
            state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception:
        raise _unreadable(path) from None
    if (
        not state
        or not isinstance(state, Mapping)
        or not all(isinstance(v, torch.Tensor) for v in state.values())
    ):
        raise _unreadable(path)
    return state


def add_control_routes(app, control: RLControl) -> None:
    """The control endpoints on a FastAPI ``app``."""

    @app.post("/pause")
    async def pause(mode: str = "abort") -> dict:
        await control.pause(mode)
        return {"paused": True, "mode": mode, "version": control.version}

    @app.post("/resume")
    async def resume() -> dict:
        control.resume()
        return {"paused": False, "version": control.version}

    @app.get("/is_paused")
    async def is_paused() -> dict:
        return {"is_paused": control.is_paused}

    @app.get("/weight_version")
    async def weight_version() -> dict:
        return {"version": control.version}

    @app.post("/update_weights")
    async def update_weights(request: Request) -> dict:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("path"), str):
            raise OpenAIError("'path' (a checkpoint directory or weights file) is required", "path")
        version = control.update_weights_from_path(body["path"], body.get("version"))
        return {"version": version}
