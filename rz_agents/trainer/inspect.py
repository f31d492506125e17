"""What one learner step trains on, token by token: the data of the trajectory inspector (report/inspector).

For chosen steps the runtime calls `record_step` with the batch the learner is about to train on. One extra
forward (no gradient) scores every token under the learner's current weights and the sampling distribution,
exactly as the learner's own forward does (the aligned forward does not depend on the batch), so the
recorded IS weights are the ones the loss uses.

A vision-language episode's images (screenshots, rendered pictures) go with it: ``record_step`` keeps
their PNG bytes and where each sits in the tokens (the first of its run of ``<|image_pad|>`` placeholders),
``write_step_record`` writes them once each, named by their content's hash, under ``inspect/images/``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rz_agents.sampling import SamplingSpec
from rz_agents.trainer.advantages import group_advantages
from rz_agents.trainer.learner import LearnerConfig, micro_batches
from rz_agents.trajectory import Trajectory


def inspected_steps(chosen: Sequence[int], total: int) -> set[int]:
    """The step indices ``chosen`` names; negative ones count from the end (-1: the last of ``total``)."""
    return {s if s >= 0 else total + s for s in chosen if -total <= s < total}


def token_names(model: torch.nn.Module) -> dict[int, str]:
    """Names for the ids ``model`` gives a meaning the run's tokenizer may not know: a vision-language
    model's image placeholders (``<|vision_start|>``, ``<|image_pad|>``, ...; the byte tokenizer has no
    text for them). Empty for a text model."""
    return model.token_names()


IMAGE_PLACEHOLDER = "<|image_pad|>"  # the name a vision-language model's token_names give its image tokens


def image_positions(pieces: Sequence[str], loss_mask: Sequence[bool], n_images: int) -> list[int]:
    """Where each of an episode's ``n_images`` images starts in its tokens: the first token of each run of
    image placeholders the policy did not sample (the template's: a sampled one is an ordinary token, as the
    learner treats it). Empty when the runs do not match the images one to one (the inspector then shows
    the images above the tokens)."""
    starts = [
        t
        for t, piece in enumerate(pieces)
        if piece == IMAGE_PLACEHOLDER
        and not loss_mask[t]
        and not (t > 0 and pieces[t - 1] == IMAGE_PLACEHOLDER and not loss_mask[t - 1])
    ]
    return starts if len(starts) == n_images else []


def record_step(
    model: torch.nn.Module,
    batch: Sequence[Trajectory],
    cfg: LearnerConfig,
    version: int,
    decode_piece: Callable[[int], str],
    *,
    sampling: SamplingSpec,
    max_lag: int | None,
) -> dict[str, Any]:
    """Per episode: each token's text, loss mask, policy version and lag, behavior and learner log-probs;
    the episode's reward and advantage; its images (PNG bytes) and where they start (``image_positions``).
    ``version`` is the learner's (the weights in ``model``). A token's text is its name from
    ``token_names`` if it has one, else ``decode_piece``'s, else ``<id N>``."""
    from rz_agents.trainer.sequence_logprobs import trajectory_logprobs

    names = token_names(model)

    def piece(token: int) -> str:
        if token in names:
            return names[token]
        try:
            text = decode_piece(token)
        except ValueError:  # an id past the tokenizer (a padding row of a larger embedding)
            text = ""
        return text or f"<id {token}>"  # (the byte tokenizer decodes ids it lacks as nothing)

    trajs = list(batch)
    advantages = group_advantages([float(t.reward) for t in trajs], [t.group_id for t in trajs], cfg.baseline)
    learner: list[list[float]] = [[] for _ in trajs]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for mb in micro_batches([len(t.tokens) for t in trajs], cfg.micro_batch_tokens):
            # (a vision-language model's trajectories with their images, as the learner scores them)
            scored = trajectory_logprobs(model, [trajs[i] for i in mb], sampling.scoring())
            for i, lp in zip(mb, scored, strict=True):
                learner[i] = [math.nan, *lp.tolist()]  # token 0 has no context
    model.train(was_training)
    episodes = []
    for t, lp, adv in zip(trajs, learner, advantages, strict=True):
        pieces, mask = [piece(int(x)) for x in t.tokens], [bool(m) for m in t.loss_mask]
        episodes.append(
            {
                "group_id": t.group_id,
                "reward": float(t.reward),
                "advantage": float(adv),
                "info": {k: v for k, v in t.info.items() if isinstance(v, (int, float, str, bool))},
                "tokens": [int(x) for x in t.tokens],
                "pieces": pieces,
                "loss_mask": mask,
                "versions": [int(v) for v in t.versions],
                "behavior_logprobs": [float(x) for x in t.behavior_logprobs],
                "learner_logprobs": lp,
                "images": list(t.images),  # PNG bytes; write_step_record stores them as files
                "image_at": image_positions(pieces, mask, len(t.images)),
            }
        )
    return {"version": int(version), "max_lag": max_lag, "episodes": episodes}


def write_image(directory: Path, png: bytes) -> str:
    """Store ``png`` under ``directory/images/`` named by its content's hash (an image shared by the
    episodes of a group, or recorded at several steps, is written once); its path relative to
    ``directory``."""
    name = f"images/{hashlib.sha256(png).hexdigest()[:24]}.png"
    path = directory / name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(png)
        tmp.replace(path)  # a kill meanwhile leaves no half image under the final name
    return name


def write_step_record(directory: str | Path, step: int, record: dict[str, Any]) -> Path:
    """``directory/step_XXXXX.json`` (non-finite floats as null); the episodes' images (PNG bytes) as files
    under ``directory/images/``, the JSON holding their paths relative to ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"step_{step:05d}.json"
    episodes = [
        {**ep, "images": [write_image(out, png) if isinstance(png, bytes) else png for png in ep["images"]]}
        if ep.get("images")
        else ep
        for ep in record.get("episodes", [])
    ]
    record = {**record, "episodes": episodes}

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, list):
            return [clean(v) for v in x]
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        return x

    path.write_text(json.dumps({"step": step, **clean(record)}))
    return path
