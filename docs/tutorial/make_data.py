"""Write the tutorial's data: tasks.jsonl (train), eval_tasks.jsonl (held-out), episodes.jsonl (demos).

The demonstrations are recorded by playing the env itself with a scripted policy, so their messages are
exactly the env's own (prompts, tool calls, tool results).

    python make_data.py            # in docs/tutorial/
"""

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lookup_envs.env import KeyLookupEnv  # noqa: E402

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def tasks(rng: random.Random, n: int, prefix: str, taken: set) -> list[dict]:
    """``n`` tasks whose (key, code) pairs are not in ``taken``: the code of a key differs between tasks,
    so only the tool knows it."""
    out = []
    while len(out) < n:
        pair = (rng.choice(LETTERS), rng.choice(LETTERS))
        if pair not in taken:
            taken.add(pair)
            out.append({"id": f"{prefix}{len(out)}", "key": pair[0], "code": pair[1]})
    return out


def scripted_episode(env: KeyLookupEnv, task: dict) -> dict:
    """Play one episode the right way; return its messages (the env's own) and tools."""
    messages, info = env.reset(options={"task": task})
    for action in (f"lookup {task['key']}", task["code"]):
        messages = messages + [{"role": "assistant", "content": action}]
        obs, reward, terminated, truncated, _ = env.step(action)
        messages += obs
    assert reward == 1.0 and terminated
    return {"messages": messages}


def main(out: Path = Path(__file__).parent, n_train: int = 400, n_eval: int = 64, n_demos: int = 400) -> None:
    rng = random.Random(0)
    taken: set = set()
    train, held_out = tasks(rng, n_train, "t", taken), tasks(rng, n_eval, "e", taken)
    env = KeyLookupEnv()
    demos = [scripted_episode(env, t) for t in train[:n_demos]]
    for name, rows in (("tasks.jsonl", train), ("eval_tasks.jsonl", held_out), ("episodes.jsonl", demos)):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
