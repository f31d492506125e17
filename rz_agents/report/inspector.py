"""The trajectory inspector: a static HTML page (no server, no script) of the batches recorded for chosen
learner steps (run_dir/inspect/step_*.json, written by `rz_agents.trainer.inspect`).

For each step, each episode's tokens in order: the policy's own tokens shaded by their importance weight
exp(logp_learner - logp_behavior) (white: exactly 1, the aligned lag-0 case; red above 1, blue below),
underlined by their policy lag, the prompt and tool output (loss mask off) in grey; the episode's reward
and advantage above it. Hovering a token shows its id, version, lag, weight and both log-probs. A
vision-language episode's images (the screenshots it saw) stand where the template placed them, their run
of ``<|image_pad|>`` placeholders folded into one token (run_dir/inspect/images/, linked to full size).
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from rz_agents.report.tables import fmt_number

STYLE = """
body{font-family:sans-serif;max-width:1200px;margin:1.5em auto;color:#222}
.legend span,.tok{white-space:pre-wrap;font-family:monospace;font-size:12.5px}
.tokens{border:1px solid #ddd;padding:6px;line-height:1.9;background:#fff}
.o{color:#999}
.l1{border-bottom:2px dashed #e08a00}.l2{border-bottom:2px solid #8e44ad}
.ep{margin:0.4em 0 1em 0}.ep h4{margin:0.2em 0;font-size:13px;font-weight:normal}
summary{cursor:pointer;font-weight:bold;margin:0.4em 0}
.legend{margin:0.5em 0 1em 0;font-size:13px}.legend span{padding:0 4px;margin-right:8px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}
img.obs{display:block;min-width:160px;max-width:480px;margin:4px 0;border:1px solid #bbb}
"""
# where inspector.html (in the run directory) finds the images write_step_record put under inspect/
IMAGES_FROM_PAGE = "inspect/"


def _shade(log_w: float) -> str:
    """Background for a policy token with log IS weight ``log_w`` (0 exactly: white)."""
    if log_w == 0.0:
        return "#ffffff"
    if not math.isfinite(log_w):
        return "#000000;color:#fff"
    alpha = 0.12 + 0.68 * min(1.0, abs(log_w) / 0.2)  # |log w| >= 0.2 (w outside [0.82, 1.22]) saturates
    rgb = "214,39,40" if log_w > 0 else "31,119,180"
    return f"rgba({rgb},{alpha:.2f})"


def _token_html(piece: str, token: int, policy: bool, version: int, step_version: int, logp, behavior) -> str:
    text = html.escape(piece) or "&#8203;"
    if not policy:
        return f'<span class="tok o" title="id {token} (prompt / tool output: not trained)">{text}</span>'
    lag = step_version - version
    log_w = (logp - behavior) if logp is not None else math.nan
    weight = math.exp(log_w) if math.isfinite(log_w) and log_w < 700 else math.inf
    title = (
        f"id {token} · v{version} · lag {lag} · w {fmt_number(weight, 6)} · "
        f"logp {fmt_number(logp, 6)} · behavior {fmt_number(behavior, 6)}"
    )
    lag_class = "" if lag == 0 else (" l1" if lag == 1 else " l2")
    return f'<span class="tok{lag_class}" style="background:{_shade(log_w)}" title="{title}">{text}</span>'


def _image_html(path: str, index: int) -> str:
    src = html.escape(IMAGES_FROM_PAGE + path)
    return f'<a href="{src}"><img class="obs" src="{src}" alt="image {index}" loading="lazy"></a>'


def _placeholders_html(ep: dict[str, Any], start: int) -> tuple[str, int]:
    """The run of image placeholders from ``start`` (the template's: none sampled) as one grey token; (its
    html, the index after it)."""
    pieces, mask, tokens = ep["pieces"], ep["loss_mask"], ep["tokens"]
    end = start
    while end < len(pieces) and pieces[end] == pieces[start] and not mask[end]:
        end += 1
    title = f"{end - start} image placeholder tokens (id {tokens[start]}; prompt / observation: not trained)"
    text = f"{html.escape(pieces[start])}×{end - start}"
    return f'<span class="tok o" title="{title}">{text}</span>', end


def _episode_html(ep: dict[str, Any], step_version: int, index: int) -> str:
    spans = []
    mask, versions, pieces = ep["loss_mask"], ep["versions"], ep["pieces"]
    images = ep.get("images") or []
    placed = dict(zip(ep.get("image_at") or [], range(len(images)), strict=False))
    if images and not placed:  # positions unknown: the images above the tokens, in order
        spans.extend(_image_html(path, i) for i, path in enumerate(images))
    t = 0
    while t < len(pieces):
        if t in placed:
            spans.append(_image_html(images[placed[t]], placed[t]))
            span, t = _placeholders_html(ep, t)
            spans.append(span)
            continue
        lp, blp = ep["learner_logprobs"][t], ep["behavior_logprobs"][t]
        spans.append(_token_html(pieces[t], ep["tokens"][t], mask[t], versions[t], step_version, lp, blp))
        t += 1
    info = ", ".join(f"{k} {html.escape(str(v))}" for k, v in ep.get("info", {}).items())
    head = (
        f"episode {index}: reward <b>{fmt_number(ep['reward'])}</b>, advantage "
        f"<b>{fmt_number(ep['advantage'])}</b>, {sum(mask)} policy tokens of {len(mask)}"
        + (f", {len(images)} image{'s' if len(images) != 1 else ''}" if images else "")
        + (f" ({info})" if info else "")
    )
    return f'<div class="ep"><h4>{head}</h4><div class="tokens">{"".join(spans)}</div></div>'


def _step_summary(record: dict[str, Any]) -> str:
    version = record["version"]
    weights, lags, rewards = [], [], []
    for ep in record["episodes"]:
        rewards.append(ep["reward"])
        for m, v, lp, blp in zip(
            ep["loss_mask"], ep["versions"], ep["learner_logprobs"], ep["behavior_logprobs"], strict=True
        ):
            if m and lp is not None:
                weights.append(math.exp(min(lp - blp, 700.0)))
                lags.append(version - v)
    cells = {
        "episodes": len(record["episodes"]),
        "mean reward": sum(rewards) / max(len(rewards), 1),
        "policy tokens": len(weights),
        "IS weight min": min(weights, default=math.nan),
        "IS weight max": max(weights, default=math.nan),
        "tokens with weight exactly 1": sum(w == 1.0 for w in weights),
        "lag max": max(lags, default=0),
        "lag bound": record.get("max_lag"),
    }
    row = "".join(f"<th>{html.escape(k)}</th>" for k in cells)
    values = "".join(f"<td>{fmt_number(v)}</td>" for v in cells.values())
    return f"<table><tr>{row}</tr><tr>{values}</tr></table>"


def write_inspector(run_dir: str | Path) -> Path | None:
    """Write run_dir/inspector.html from run_dir/inspect/step_*.json; None when no step was recorded."""
    run = Path(run_dir)
    files = sorted((run / "inspect").glob("step_*.json"))
    if not files:
        return None
    records = sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["step"])
    legend = (
        '<div class="legend">policy tokens shaded by IS weight: '
        f'<span class="tok" style="background:{_shade(0.0)};border:1px solid #ccc">exactly 1</span>'
        f'<span class="tok" style="background:{_shade(0.05)}">1.05</span>'
        f'<span class="tok" style="background:{_shade(0.25)}">&gt;1.22</span>'
        f'<span class="tok" style="background:{_shade(-0.05)}">0.95</span>'
        f'<span class="tok" style="background:{_shade(-0.25)}">&lt;0.82</span>'
        ' lag: <span class="tok">0</span><span class="tok l1">1</span><span class="tok l2">2+</span>'
        ' <span class="tok o">prompt / tool output (not trained)</span> — hover a token for its numbers</div>'
    )
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>rz_agents trajectory inspector</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>Trajectory inspector: {html.escape(run.name)}</h1>",
        legend,
        "<p>steps (the last shown first): "
        + " ".join(f"<a href='#step{r['step']}'>{r['step']}</a>" for r in records)
        + "</p>",
    ]
    for record in reversed(records):  # the last step first: the page opens on the trained policy
        parts.append(
            f"<h2 id='step{record['step']}'>Learner step {record['step']} (version {record['version']})</h2>"
        )
        parts.append(_step_summary(record))
        groups: dict[str, list[tuple[int, dict]]] = {}
        for i, ep in enumerate(record["episodes"]):
            groups.setdefault(str(ep["group_id"]), []).append((i, ep))
        # groups that taught something (an episode with non-zero advantage) first; uniform ones after
        ordered = sorted(groups.items(), key=lambda g: not any(ep["advantage"] for _, ep in g[1]))
        for n, (group, members) in enumerate(ordered):
            rewards = ", ".join(fmt_number(ep["reward"]) for _, ep in members)
            opened = " open" if n == 0 else ""
            parts.append(f"<details{opened}><summary>group {html.escape(group)}: rewards {rewards}</summary>")
            parts.extend(_episode_html(ep, record["version"], i) for i, ep in members)
            parts.append("</details>")
    parts.append("</body></html>")
    out = run / "inspector.html"
    out.write_text("\n".join(parts))
    return out
