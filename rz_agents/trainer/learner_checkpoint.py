"""The learner's tensors in a ``torch.distributed.checkpoint`` (DCP) folder: every rank writes and reads its
own shards, so no rank ever holds the gathered state.

One layout for any number of ranks (a checkpoint moves between ``learner_ranks`` 1 and N; DCP reshards on
load), keyed by parameter name:

- ``masters/<name>``: the fp32 tensors AdamW updates, one per trainable parameter: the separate fp32 copies
  (one process, bf16 model), the fp32 shards (FSDP2 ranks) or the fp32 parameters themselves. The model's
  weights are not stored: they are always these rounded to the model's dtype (``MasterWeights``), so a
  resume rounds them again and gets the same bits.
- ``optimizer/<name>/<key>``: AdamW's per-parameter state (``exp_avg``, ``exp_avg_sq``, ``step``), sharded
  like the parameter where it has the parameter's shape.
- the parameters that do not train (LoRA's base) are not in the folder: a warm start may have changed them
  from what the config builds and no master rebuilds them, so the checkpoint needs them, but they do not
  change from step to step: they are written once per run into ``frozen_base/<hash>`` beside the checkpoint
  file and the small state names that folder and the base's SHA-256 (trainer/frozen_base.py), checked on
  resume. (Folders written before that hold them as ``frozen/<name>``; they still load.)

Everything small (param groups, schedule, version, counters) is returned to the caller, which keeps it in
the runtime checkpoint file next to the folder (trainer/checkpoint.py). One process writes the same folder
with ``no_dist`` (no process group needed).

Checkpoints from before folders (checkpoint format 1) held the learner's whole tensors in the file itself
(``model``, ``masters``, ``optimizer`` beside the counters); ``load_whole_tensor_state`` still reads them,
with a deprecation warning, and nothing writes them any more.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rz_agents.deprecation import warn_deprecated
from rz_agents.trainer.frozen_base import frozen_params, load_frozen_base, save_frozen_base

if TYPE_CHECKING:
    from rz_agents.trainer.learner import Learner

FORMAT = "dcp-1"  # the "format" entry of the small state this module returns


def _names(learner: Learner) -> list[str]:
    """The parameter name of each trainable parameter, in ``learner.params`` (= optimizer) order."""
    by_id = {id(p): n for n, p in learner.model.named_parameters()}
    return [by_id[id(p)] for p in learner.params]


def _distributed(learner: Learner) -> bool:
    """Whether the learner's tensors are DTensor shards of a process group (FSDP2 ranks)."""
    return learner.ranks.keeps_fp32_shards


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """DCP warns at every one-process save and load that it assumes one process: it is told so."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_learner_state(learner: Learner, directory: str | Path) -> dict[str, Any]:
    """Write ``learner``'s tensors into ``directory`` (every rank its own shards; a collective with several
    ranks) and return the rest of its state (the same on every rank)."""
    import torch.distributed.checkpoint as dcp  # (here: importing it costs a second at every start)

    names = _names(learner)
    tensors: dict[str, torch.Tensor] = {
        f"masters/{name}": t.detach()
        for name, t in zip(names, learner.master_weights.optimized(), strict=True)
    }
    optimizer = learner.optimizer.state_dict()
    other: dict[int, dict[str, Any]] = {}
    for index, per_param in optimizer["state"].items():
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{names[index]}/{key}"] = value
            else:
                other.setdefault(index, {})[key] = value
    with _quiet():
        dcp.save(
            tensors,
            storage_writer=dcp.FileSystemWriter(str(directory), sync_files=True),
            no_dist=not _distributed(learner),
        )
        # the run directory: the folder's parent (the runtime's checkpoint folders live beside their file)
        frozen_base = save_frozen_base(learner, Path(directory).parent, _distributed(learner))
    return {
        "format": FORMAT,
        "frozen_base": frozen_base,
        "optimizer_param_groups": optimizer["param_groups"],
        "optimizer_other": other,
        **learner.counters(),
    }


@torch.no_grad()
def load_learner_state(learner: Learner, state: dict[str, Any], directory: str | Path) -> None:
    """Restore what ``save_learner_state`` wrote to ``directory`` and returned as ``state`` (every rank reads
    only its own shards; any number of ranks may have written the folder)."""
    import torch.distributed.checkpoint as dcp

    if state.get("format") != FORMAT:
        raise ValueError(f"learner state format {state.get('format')!r}, expected {FORMAT!r}")
    directory = str(directory)
    names = _names(learner)
    optimized = learner.master_weights.optimized()
    by_name = dict(zip(names, optimized, strict=True))
    saved = dcp.FileSystemReader(directory).read_metadata().state_dict_metadata
    # Load in place: the masters into the optimized tensors themselves; the optimizer state into tensors made
    # from the folder's metadata, like the parameter (so sharded alike) where they have its whole shape.
    targets: dict[str, torch.Tensor] = {f"masters/{n}": t.detach() for n, t in by_name.items()}
    per_param: dict[int, dict[str, Any]] = {}
    index = {n: i for i, n in enumerate(names)}
    frozen = dict(frozen_params(learner))
    for key in saved:  # (a folder from before frozen_base/; one from before frozen/ keeps the config's base)
        kind, _, name = key.partition("/")
        if kind == "frozen":
            if name not in frozen:
                raise ValueError(f"{directory}: frozen weight {name!r}, which this model does not have")
            targets[key] = frozen[name].detach()
    for key, meta in saved.items():
        kind, _, rest = key.partition("/")
        if kind != "optimizer":
            continue
        name, _, field = rest.rpartition("/")
        if name not in by_name:
            raise ValueError(f"{directory}: optimizer state for {name!r}, which this model does not have")
        param = by_name[name]
        dtype = meta.properties.dtype
        like_param = tuple(meta.size) == tuple(param.shape)
        target = torch.zeros_like(param, dtype=dtype) if like_param else torch.zeros(meta.size, dtype=dtype)
        targets[key] = target
        per_param.setdefault(index[name], {})[field] = target
    with _quiet():
        dcp.load(targets, storage_reader=dcp.FileSystemReader(directory), no_dist=not _distributed(learner))
        if state.get("frozen_base") is not None:
            load_frozen_base(learner, Path(directory).parent, state["frozen_base"], _distributed(learner))
    learner.master_weights.round_into_model()  # one process with fp32 copies: the model's weights from them
    for i, extra in state["optimizer_other"].items():
        per_param.setdefault(int(i), {}).update(extra)
    learner.optimizer.load_state_dict({"state": per_param, "param_groups": state["optimizer_param_groups"]})
    learner.load_counters(state)


@torch.no_grad()
def load_whole_tensor_state(learner: Learner, state: dict[str, Any]) -> None:
    """Restore a learner state of the format before folders: whole tensors in ``state`` (every rank cuts its
    shards from them). Deprecated: a checkpoint saved now writes the folder format."""
    warn_deprecated(
        "this checkpoint holds the learner's whole tensors (the format before folders): "
        "it loads, but the format is deprecated; the run's next checkpoint is saved in the folder format",
        stacklevel=5,  # (the caller of Learner.load_state, past torch.no_grad's wrapper)
    )
    learner._load_model(state)  # (the learner's own loader of whole weights and masters)
    optimizer = state["optimizer"]
    if learner.ranks.world > 1:
        optimizer = {**optimizer, "state": dict(optimizer["state"])}
        for index, per_param in optimizer["state"].items():
            param = learner.master_weights.optimized()[int(index)]
            optimizer["state"][index] = {
                k: learner.ranks.shard_like(v, param) if isinstance(v, torch.Tensor) and v.dim() else v
                for k, v in per_param.items()
            }
    learner.optimizer.load_state_dict(optimizer)
    learner.load_counters(state)
