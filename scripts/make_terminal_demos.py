"""Write the warm-start episodes of configs/terminal-tiny.yaml: the easiest packaged Harbor tasks, each
solved by one bash call, half of them with the right command and half with a near miss.

    python scripts/make_terminal_demos.py [--out configs/terminal-tiny-demos.jsonl] [--per-task 64]

Every command is run in the task's real sandbox and scored by its verifier when the file is written: a
right command's episode must score 1.0 and a near miss 0.0 (else the script fails), and each episode's
tool message is the observation the env really returned. The warm start teaches the call format and both
commands; RL then has to learn which one pays (the policy starts near 50% on each task).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from rz_agents.envs.harbor.env import ShellTaskEnv

# task -> (the right command, a near miss the verifier rejects)
COMMANDS = {
    "hello-file": ("echo 'Hello, world!' > /app/hello.txt", "echo 'Hello world' > /app/hello.txt"),
    "make-dirs": (
        "mkdir -p /app/project/src /app/project/tests /app/project/docs",
        "mkdir -p /app/project/src /app/project/docs",
    ),
    "line-count": ("wc -l < /app/big.txt > /app/lines.txt", "wc -c < /app/big.txt > /app/lines.txt"),
    "sort-unique": ("sort -u /app/names.txt > /app/sorted.txt", "sort /app/names.txt > /app/sorted.txt"),
}
TASKS = list(COMMANDS)


def call_text(command: str) -> str:
    """The assistant turn that calls the bash tool (Qwen3/Hermes format, compact JSON)."""
    return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "</tool_call>"


def scored_episode(env: ShellTaskEnv, name: str, command: str) -> tuple[dict, float]:
    """The episode of one call of ``command`` on task ``name`` as the env runs it, and its reward."""
    messages, info = env.reset(seed=0, options={"task": {"path": str(_path(env, name))}})
    assert not info.get("infra_failure"), info
    turn = call_text(command)
    observation, _, _, _, _ = env.step(turn)
    _, reward, terminated, _, _ = env.step("Done.")
    assert terminated
    episode = [*messages, {"role": "assistant", "content": turn}, *observation]
    episode.append({"role": "assistant", "content": "Done."})
    return {"messages": episode}, reward


def _path(env: ShellTaskEnv, name: str) -> Path:
    return next(p for p in env.task_paths if p.name == name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="configs/terminal-tiny-demos.jsonl")
    parser.add_argument("--per-task", type=int, default=64, help="episodes per task (half right, half not)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    env = ShellTaskEnv(max_turns=2, names=TASKS, system_prompt=None, advertise_tools=False)
    lines = []
    try:
        for name, (right, miss) in COMMANDS.items():
            good, r_good = scored_episode(env, name, right)
            bad, r_bad = scored_episode(env, name, miss)
            if (r_good, r_bad) != (1.0, 0.0):
                raise SystemExit(f"{name}: right command scored {r_good}, near miss {r_bad} (want 1.0, 0.0)")
            print(f"{name}: right {r_good} / near miss {r_bad}; tool says {good['messages'][2]['content']!r}")
            half = args.per_task // 2
            lines += [good] * half + [bad] * (args.per_task - half)
    finally:
        env.close()
    random.Random(args.seed).shuffle(lines)
    out = Path(args.out)
    out.write_text("".join(json.dumps(e) + "\n" for e in lines))
    print(f"wrote {len(lines)} episodes to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
