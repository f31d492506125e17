"""Ray resource preflight: refuse, in one line, a run whose actors the cluster cannot all place.

Ray queues an actor whose resources no node has and waits for them forever: the 16-GPU Qwen3-4B recipe on
an 8-GPU cluster used to start its learner ranks and leave the engine replicas pending with no message.
Before any actor starts, ``preflight`` compares what ``actors:`` asks for with the alive nodes of the
cluster (``ray.nodes()``):

- totals: GPUs, CPUs and every custom resource the actors reserve against the cluster's;
- placement: each actor needs one node holding all of its CPUs, GPUs and custom resources at once (first
  fit, largest actors first: a cluster with enough GPUs in all but none with the CPUs beside them fails);
- GPU memory: where the nodes report their GPU type (Ray's ``accelerator_type:<name>`` resource) and the
  card table (``rz_kernels.compile_check.cards``) knows it, an engine replica's and a learner rank's memory
  estimate (``rz train CONFIG --dry-run``) against 90% of that card's memory times the GPUs the actor holds.

Host memory is not compared: the actors reserve none of Ray's ``memory`` resource. An autoscaling cluster,
whose nodes appear on demand, skips the check with ``RZ_SKIP_RAY_PREFLIGHT=1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rz_agents.runtime.config import ActorsConfig

GIB = 1024**3
USABLE_FRACTION = 0.9  # of a card's memory: what the dry run's "fits" allows (CUDA context, fragmentation)
SKIP_ENV = "RZ_SKIP_RAY_PREFLIGHT"


class ClusterTooSmall(RuntimeError):
    """The cluster cannot place every actor of ``actors:``; the message names the shortfall."""


@dataclass(frozen=True)
class ActorDemand:
    """One kind of actor: how many, and what each reserves (``gpu_memory``: its estimate in bytes, 0 when
    unknown)."""

    kind: str
    count: int
    cpus: float
    gpus: float
    resources: dict[str, float] = field(default_factory=dict)
    gpu_memory: int = 0


def actor_demands(p: ActorsConfig, estimate: Any | None = None) -> list[ActorDemand]:
    """The actors a run starts (RayRun._place), with the memory estimate's per-actor bytes when given."""
    return [
        ActorDemand("engine replica", p.engines, p.cpus_per_engine, p.engine_gpus, dict(p.engine_resources),
                    estimate.engine_total if estimate is not None else 0),
        ActorDemand("learner rank", p.learner_ranks, p.cpus_per_learner_rank, p.learner_gpus,
                    dict(p.learner_resources), estimate.learner_rank_total if estimate is not None else 0),
        ActorDemand("env worker", p.env_workers, p.cpus_per_env_worker, 0.0, dict(p.env_worker_resources)),
    ]  # fmt: skip


def _needs(d: ActorDemand) -> dict[str, float]:
    need = {"CPU": d.cpus, "GPU": d.gpus, **d.resources}
    return {k: v for k, v in need.items() if v}


def _fmt(x: float) -> str:
    return f"{x:g}"


def _totals_shortfall(demands: list[ActorDemand], nodes: list[dict[str, float]]) -> str | None:
    """Every resource the actors ask more of than the cluster has in all (GPUs first), or None."""
    names = sorted({k for d in demands for k in _needs(d)}, key=lambda k: ("GPU", "CPU", k).index(k))
    short = []
    for name in names:
        parts = [(d, _needs(d).get(name, 0.0)) for d in demands if _needs(d).get(name)]
        need = sum(d.count * each for d, each in parts)
        have = sum(n.get(name, 0.0) for n in nodes)
        if need > have + 1e-9:
            how = " + ".join(f"{d.count} {d.kind}s x {_fmt(each)}" for d, each in parts)
            short.append(f"needs {_fmt(need)} {name} ({how}), the cluster has {_fmt(have)}")
    return "; ".join(short) or None


def _first_fit(actors: list[ActorDemand], nodes: list[dict[str, float]]) -> str | None:
    """Place ``actors`` in order, each on the first node with room; the first that fits nowhere, or None."""
    free = [dict(n) for n in nodes]
    placed: dict[str, int] = {}
    for d in actors:
        need = _needs(d)
        for node in free:
            if all(node.get(k, 0.0) + 1e-9 >= v for k, v in need.items()):
                for k, v in need.items():
                    node[k] = node.get(k, 0.0) - v
                placed[d.kind] = placed.get(d.kind, 0) + 1
                break
        else:
            want = ", ".join(f"{_fmt(v)} {k}" for k, v in need.items())
            return (
                f"{d.kind} {placed.get(d.kind, 0) + 1} of {d.count} ({want} on one node) fits on no node "
                f"beside the actors placed before it ({len(nodes)} nodes)"
            )
    return None


def _placement_shortfall(demands: list[ActorDemand], nodes: list[dict[str, float]]) -> str | None:
    """A shortfall only if no order tried places every actor (first fit is a heuristic: refusing a cluster
    that could hold the run is worse than missing one, which Ray then queues as before): pinned actors
    first, then GPUs, then CPUs; and by GPUs and CPUs alone."""
    actors = [d for d in demands for _ in range(d.count)]
    orders = (
        lambda d: (bool(d.resources), d.gpus, d.cpus, sum(d.resources.values())),
        lambda d: (d.gpus, d.cpus),
        lambda d: (d.cpus, d.gpus),
    )
    first = None
    for key in orders:
        short = _first_fit(sorted(actors, key=key, reverse=True), nodes)
        if short is None:
            return None
        first = first or short
    return first


def _memory_shortfall(demands: list[ActorDemand], nodes: list[dict[str, float]]) -> str | None:
    from rz_kernels.compile_check.cards import card_for

    prefix = "accelerator_type:"
    types = {k[len(prefix) :] for n in nodes if n.get("GPU") for k in n if k.startswith(prefix)}
    cards = []
    for name in types:
        try:
            cards.append(card_for(name))
        except ValueError:
            return None  # a GPU the table does not know: no memory figure to compare with
    if not cards:
        return None
    card = min(cards, key=lambda c: c.memory_gib)  # an actor may land on the smallest
    for d in demands:
        if not (d.gpus and d.gpu_memory):
            continue
        usable = USABLE_FRACTION * card.memory_gib * GIB * d.gpus
        if d.gpu_memory > usable:
            return (
                f"one {d.kind} needs {d.gpu_memory / GIB:.1f} GiB (rz train CONFIG --dry-run), its "
                f"{_fmt(d.gpus)} {card.name} GPU holds {usable / GIB:.1f} GiB usable"
            )
    return None


def placement_shortfall(demands: list[ActorDemand], nodes: list[dict[str, float]]) -> str | None:
    """What keeps ``demands`` off a cluster of ``nodes`` (each node's resources, as Ray reports them), in
    one line; None when every actor can be placed."""
    return (
        _totals_shortfall(demands, nodes)
        or _placement_shortfall(demands, nodes)
        or _memory_shortfall(demands, nodes)
    )


def cluster_nodes() -> list[dict[str, float]]:
    """The resources of every alive node of the connected Ray cluster."""
    import ray

    return [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]


def preflight(actors: ActorsConfig, estimate: Any | None = None, nodes: list[dict[str, float]] | None = None):
    """Raise ClusterTooSmall naming the shortfall if the cluster (``nodes``, default the connected one's)
    cannot place every actor; skipped when RZ_SKIP_RAY_PREFLIGHT=1 (an autoscaling cluster)."""
    import os

    if os.environ.get(SKIP_ENV) == "1":
        return
    nodes = cluster_nodes() if nodes is None else nodes
    short = placement_shortfall(actor_demands(actors, estimate), nodes)
    if short:
        raise ClusterTooSmall(
            f"the Ray cluster cannot place every actor of actors: {short}; shrink actors: or grow the "
            f"cluster (an autoscaling cluster: {SKIP_ENV}=1)"
        )


def run_estimate(cfg: Any) -> Any | None:
    """The run's memory estimate (what ``rz train CONFIG --dry-run`` prints) when its actors hold GPUs and
    the model can be sized; None otherwise (the memory comparison is then skipped)."""
    if not (cfg.actors.engine_gpus or cfg.actors.learner_gpus):
        return None
    from rz_agents.runtime.memory_estimate import estimate_memory, model_config_of

    try:
        model_cfg, source = model_config_of(cfg.model)
        return estimate_memory(cfg, model_cfg, source)
    except Exception:  # noqa: BLE001 - sizing is best effort here; the dry run reports why
        return None
