"""Group-baseline advantages: A = r - baseline(group), computed per group of samples of one prompt."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

BASELINES = ("mean", "leave_one_out")


def group_advantages(
    rewards: Sequence[float], group_ids: Sequence[Hashable], baseline: str = "mean"
) -> list[float]:
    """Advantage of each sample against its group.

    mean:          A_i = r_i - mean(r over the group, including i)
    leave_one_out: A_i = r_i - mean(r over the group without i)  (= mean-baseline A * G/(G-1));
                   a group of one sample gets A = 0 (it has no baseline).
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards for {len(group_ids)} group ids")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        members[g].append(i)
    adv = [0.0] * len(rewards)
    for idx in members.values():
        total = sum(float(rewards[i]) for i in idx)
        n = len(idx)
        for i in idx:
            r = float(rewards[i])
            if baseline == "mean":
                adv[i] = r - total / n
            else:
                adv[i] = r - (total - r) / (n - 1) if n > 1 else 0.0
    return adv


def uniform_groups(rewards: Sequence[float], group_ids: Sequence[Hashable]) -> set[Hashable]:
    """The groups whose rewards are all equal: every member's advantage is 0 under either baseline, so
    they add nothing to the gradient (``rollout.skip_uniform_groups`` leaves them out of the learner pass)."""
    seen: dict[Hashable, set[float]] = defaultdict(set)
    for r, g in zip(rewards, group_ids, strict=True):
        seen[g].add(float(r))
    return {g for g, values in seen.items() if len(values) == 1}
