"""OSWorld success rate: run a policy on every runnable task of a set through ``OSWorldEnv``.

Each task runs in a fresh desktop (the env's reset); a task that fails to set up or crashes is
recorded with its error and scores 0 without stopping the run. Tasks that cannot run here
(``runnability.check_task``) are reported as skipped with their reasons. A policy may return plain
text or a ``Reply`` with token counts (model policies do): each row then reports the prompt and
completion tokens of its episode.

With a task list (OSWorld's ``test_all.json``: domain -> ids) the run covers the listed tasks and
the summary adds the whole-benchmark figure: OSWorld's harness runs every listed task and scores
the benchmark over all of them, so here a listed task that cannot run (skipped, or its file
missing) counts as a failure in ``benchmark`` (score sum / tasks listed), per domain and overall,
besides the success over the tasks evaluated (what OSWorld's ``show_result.py`` prints as each
domain's "Runned" success, with its Office / Daily / Professional groups).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rz_agents.envs.osworld.cache import default_cache_dir
from rz_agents.envs.osworld.policies import Policy, load_policy
from rz_agents.envs.osworld.runnability import check_task
from rz_agents.envs.osworld.task import Task, TaskFormatError, load_tasks
from rz_agents.eval.osworld_policies import Reply


def run_osworld_eval(
    tasks_path: str | Path,
    policy: str | Policy = "oracle",
    max_steps: int = 15,
    action_space: str = "pyautogui",
    provider: str = "local",
    provider_options: dict[str, Any] | None = None,
    download_cache: str | None = None,
    include_unrunnable: bool = False,
    pause: float = 0.5,
    max_tree_tokens: int = 10000,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    subset: dict[str, list[str]] | None = None,
    observation: str = "a11y_tree",
    image_size: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Evaluate ``policy`` on the tasks at ``tasks_path`` (a file or folder).

    ``observation`` / ``image_size``: what the policy sees (``OSWorldEnv``'s options: the tree, a
    screenshot at ``image_size``, or both).

    ``subset``: OSWorld's task list (domain -> ids); only listed tasks run (a task file named after
    its id, in its domain's folder), listed tasks with no file are rows with status ``missing``,
    and the summary has the whole-benchmark figure (see the module doc).

    Returns ``{"tasks": [per-task dicts], "success_rate", "evaluated", "skipped", "by_domain"}``;
    each task dict has ``id``, ``domain``, ``status`` (``ok``/``error``/``skipped``), ``score``,
    ``turns``, ``seconds``, ``prompt_tokens``/``completion_tokens`` (summed over the episode's
    turns, 0 for text-only policies) and ``error``/``reasons`` when relevant.
    """
    from rz_agents.envs.osworld.gym_env import OSWorldEnv

    cache = download_cache or default_cache_dir()
    fn = load_policy(policy, tasks_path)
    env_options = dict(
        max_turns=max_steps,
        action_space=action_space,
        provider=provider,
        provider_options=provider_options,
        download_cache=cache,
        pause=pause,
        max_tree_tokens=max_tree_tokens,
        observation=observation,
        image_size=image_size,
    )
    results: list[dict[str, Any]] = []
    env: OSWorldEnv | None = None
    listed = {(d, i) for d, ids in subset.items() for i in ids} if subset is not None else None
    seen: set[tuple[str, str]] = set()

    def emit(row: dict[str, Any]) -> None:
        results.append(row)
        if on_result is not None:
            on_result(row)

    try:
        for path, task in _selected_tasks(tasks_path, listed, seen):
            row = _row_without_running(path, task, cache, include_unrunnable)
            if row is None:
                if env is None:  # the desktop starts with the first task that runs
                    env = OSWorldEnv(**env_options)
                row = _run_one(env, task, fn)
            emit(row)
        for domain, task_id in sorted((listed or set()) - seen):
            emit({"id": task_id, "domain": domain, "status": "missing", "score": None,
                  "reasons": ["task file not found under the task folder"]})  # fmt: skip
    finally:
        if env is not None:
            env.close()
    return summarize(results, benchmark=subset is not None)


def _selected_tasks(
    tasks_path: str | Path, listed: set[tuple[str, str]] | None, seen: set[tuple[str, str]]
) -> Iterator[tuple[Path, Task | TaskFormatError]]:
    """(path, task) of every task file, or with ``listed`` (domain, id) of those listed only, once each
    (``seen`` collects them)."""
    for path, task in load_tasks(tasks_path):
        if listed is not None:
            key = (path.parent.name, path.stem)  # "<id>-win.json" variants are not the listed task
            if key not in listed or key in seen:
                continue
            seen.add(key)
        yield path, task


def _row_without_running(
    path: Path, task: Task | TaskFormatError, cache: str, include_unrunnable: bool
) -> dict[str, Any] | None:
    """The result row of a task that does not run (a malformed file: ``error``; a task this machine cannot
    run: ``skipped`` with the reasons); None for a task to run."""
    if isinstance(task, TaskFormatError):
        return {
            "id": path.stem,
            "domain": path.parent.name,
            "status": "error",
            "score": 0.0,
            "error": str(task),
        }
    reasons = check_task(task, cache).reasons
    if reasons and not include_unrunnable:
        return {
            "id": task.id,
            "domain": task.domain,
            "status": "skipped",
            "score": None,
            "reasons": [f"{c}: {d}" for c, d in reasons],
        }
    return None


def _run_one(env: Any, task: Task, policy: Policy) -> dict[str, Any]:
    t0 = time.perf_counter()
    row: dict[str, Any] = {"id": task.id, "domain": task.domain, "status": "ok", "score": 0.0, "turns": 0,
                           "prompt_tokens": 0, "completion_tokens": 0}  # fmt: skip
    try:
        messages, _info = env.reset(options={"task": task.raw})
        history = list(messages)
        while True:
            reply = policy(history, task.raw)
            if isinstance(reply, Reply):
                row["prompt_tokens"] += reply.prompt_tokens
                row["completion_tokens"] += reply.completion_tokens
                reply = reply.text
            history.append({"role": "assistant", "content": reply})
            obs, reward, terminated, truncated, info = env.step(reply)
            history.extend(obs)
            row["turns"] += 1
            if terminated or truncated:
                row["score"] = float(reward)
                ev = info.get("evaluation") or {}
                if ev.get("errors"):
                    row["error"] = "; ".join(ev["errors"])
                break
    except Exception as exc:  # one task's failure is recorded, never fatal for the run
        row.update(status="error", score=0.0, error=f"{type(exc).__name__}: {exc}")
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


# OSWorld's show_result.py groups (multi_apps, "Workflow" in the paper, is in none of them).
GROUPS = {
    "Office": ("libreoffice_calc", "libreoffice_impress", "libreoffice_writer"),
    "Daily": ("vlc", "thunderbird", "chrome"),
    "Professional": ("gimp", "vs_code"),
}


def summarize(results: list[dict[str, Any]], benchmark: bool = False) -> dict[str, Any]:
    """Success over evaluated tasks (skipped and missing ones excluded), overall and per domain.

    ``benchmark``: the rows are a whole task list; add ``benchmark`` (score sum over every row:
    tasks that could not run score 0, none dropped), per domain too, and OSWorld's groups.
    """
    evaluated = [r for r in results if r["status"] not in ("skipped", "missing")]
    by_domain: dict[str, dict[str, Any]] = {}
    for r in results:
        d = by_domain.setdefault(r["domain"], {"listed": 0, "evaluated": 0, "score_sum": 0.0})
        d["listed"] += 1
        if r["status"] not in ("skipped", "missing"):
            d["evaluated"] += 1
            d["score_sum"] += r["score"] or 0.0
    for d in by_domain.values():
        d["not_run"] = d["listed"] - d["evaluated"]
        d["success_rate"] = d["score_sum"] / d["evaluated"] if d["evaluated"] else 0.0
        d["benchmark_success_rate"] = d["score_sum"] / d["listed"]
    if not benchmark:
        by_domain = {k: v for k, v in by_domain.items() if v["evaluated"]}
        for d in by_domain.values():
            for key in ("listed", "not_run", "benchmark_success_rate"):
                d.pop(key)
    score_sum = sum(r["score"] or 0.0 for r in evaluated)
    summary = {
        "tasks": results,
        "evaluated": len(evaluated),
        "skipped": sum(r["status"] == "skipped" for r in results),
        "success_rate": (score_sum / len(evaluated)) if evaluated else 0.0,
        "by_domain": by_domain,
    }
    if benchmark:
        missing = sum(r["status"] == "missing" for r in results)
        groups = {}
        for name, domains in GROUPS.items():
            ds = [by_domain[x] for x in domains if x in by_domain]
            n = sum(d["evaluated"] for d in ds)
            groups[name] = {"evaluated": n, "success_rate": sum(d["score_sum"] for d in ds) / n if n else 0.0}
        summary["missing"] = missing
        summary["benchmark"] = {
            "listed": len(results),
            "evaluated": len(evaluated),
            "not_run": len(results) - len(evaluated),
            "score_sum": score_sum,
            "success_rate": score_sum / len(results) if results else 0.0,
            "groups": groups,
        }
    return summary


def format_table(summary: dict[str, Any]) -> str:
    """The success table as plain text: one row per task, then per-domain and overall rates."""
    lines = [
        f"{'task':<44} {'domain':<10} {'status':<8} {'score':>5} {'turns':>5} {'secs':>6} "
        f"{'prompt_tok':>10} {'reply_tok':>9}"
    ]
    for r in summary["tasks"]:
        score = "-" if r["score"] is None else f"{r['score']:.2f}"
        lines.append(
            f"{r['id'][:44]:<44} {r['domain'][:10]:<10} {r['status']:<8} {score:>5} "
            f"{r.get('turns', '-')!s:>5} {r.get('seconds', '-')!s:>6} "
            f"{r.get('prompt_tokens', '-')!s:>10} {r.get('completion_tokens', '-')!s:>9}"
        )
        note = r.get("error") or ("; ".join(r["reasons"][:2]) if r.get("reasons") else "")
        if note and r["status"] != "ok" or (r.get("error") and r["status"] == "ok"):
            lines.append(f"    {note[:150]}")
    lines.append("")
    bench = summary.get("benchmark")
    for name, d in sorted(summary["by_domain"].items()):
        line = f"{name:<10} success {d['success_rate']:.3f} over {d['evaluated']} tasks"
        if bench:
            line = (f"{name:<19} success {d['success_rate']:.3f} over {d['evaluated']:>3} run; "
                    f"benchmark {d['benchmark_success_rate']:.3f} over {d['listed']:>3} listed "
                    f"({d['not_run']} not run here, counted as failures)")  # fmt: skip
        lines.append(line)
    if bench:
        for name, g in bench["groups"].items():
            lines.append(f"{name:<19} success {g['success_rate']:.3f} over {g['evaluated']:>3} run")
    lines.append(
        f"overall    success {summary['success_rate']:.3f} over {summary['evaluated']} tasks "
        f"({summary['skipped']} skipped: cannot run here)"
    )
    if bench:
        lines.append(
            f"benchmark  success {bench['success_rate']:.3f} over all {bench['listed']} listed tasks "
            f"({bench['not_run']} not run here: {summary['skipped']} cannot run, {summary['missing']} "
            "missing; each counted as a failure, as OSWorld scores the whole list)"
        )
    return "\n".join(lines)
