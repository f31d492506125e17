"""Write the warm-start episodes of configs/miniswe-tiny.yaml: mini-swe-agent's own conversations on the
easiest packaged Harbor tasks, one command then the submit command, half with the right command and half
with a near miss the verifier rejects (the commands of scripts/make_terminal_demos.py).

    python scripts/make_miniswe_demos.py [--out configs/miniswe-tiny-demos.jsonl] [--per-task 16] [--names]

Nothing is rendered here: each conversation is what the unmodified mini-swe-agent CLI itself sent and
received, run with rz's prompts (agents/miniswe/rz_terminal.yaml) and its own scripted test model
(``model_class: deterministic``) replying "```bash\\n<command>\\n```" in place of the policy: its system and
instance templates, its observation template on the sandbox's real output, its history. Every command runs
in the task's bubblewrap workspace through the episode's command endpoint and the verifier scores it: a
right command's episode must submit and score 1.0 and a near miss 0.0, else the script fails. Needs the
mini-swe-agent venv (scripts/install_miniswe.sh) and bubblewrap.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from make_terminal_demos import COMMANDS  # scripts/ is sys.path[0] when run as a script

from rz_agents.agents.miniswe import MiniSweAgent
from rz_agents.agents.miniswe.command_endpoint import CommandEndpoint
from rz_agents.rollout.agent_loop import EpisodeLimits

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def reply_text(command: str) -> str:
    """The policy's reply that runs ``command`` in mini-swe-agent's text format (rz_terminal.yaml's regex)."""
    return f"```bash\n{command}\n```"


class ScriptedMiniSweAgent(MiniSweAgent):
    """The episode runner with mini-swe-agent's own scripted model in place of the session: it replies
    ``reply_text(c)`` for each of ``commands`` in turn (the policy's replies, parsed by the agent)."""

    def __init__(self, commands: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = commands

    def episode_config(self, *args: Any) -> dict[str, Any]:
        """rz's episode config with the scripted model (rz_terminal.yaml's templates still apply)."""
        config = super().episode_config(*args)
        outputs = [
            {"role": "assistant", "content": reply_text(c), "extra": {"actions": [{"command": c}]}}
            for c in self.commands
        ]
        config["model"] = {"model_class": "deterministic", "model_name": "scripted", "outputs": outputs}
        return config


def scripted_episode(name: str, command: str) -> tuple[list[dict[str, str]], float]:
    """mini-swe-agent's messages (role and content) for ``command`` then the submit command on task
    ``name``, and the verifier's reward of the workspace it left."""
    agent = ScriptedMiniSweAgent([command, SUBMIT], names=[name], command_timeout_s=10)
    env = agent._make_env(3)
    env.reset(seed=0)
    endpoint = CommandEndpoint(env)
    try:
        run = agent._run_mini("http://127.0.0.1:9/unused", endpoint, env, EpisodeLimits(max_turns=3))
        if run["returncode"] != 0 or run["exit_status"] != "Submitted":
            raise SystemExit(f"{name}: mini-swe-agent did not submit ({run['exit_status']}): {run['stderr']}")
        reward = env.verify().reward
    finally:
        endpoint.close()
        env.close()
    # its history less the exit record: what it sent the model, then the replies it got
    messages = [{"role": m["role"], "content": m["content"]} for m in run["messages"] if m["role"] != "exit"]
    roles = [m["role"] for m in messages]
    if roles != ["system", "user", "assistant", "user", "assistant"]:
        raise SystemExit(f"{name}: unexpected history {roles}")
    return messages, reward


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="configs/miniswe-tiny-demos.jsonl")
    parser.add_argument("--per-task", type=int, default=16, help="episodes per task (half right, half not)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--names", nargs="+", choices=list(COMMANDS), default=list(COMMANDS), help="tasks")
    args = parser.parse_args(argv)
    lines = []
    for name in args.names:
        right, miss = COMMANDS[name]
        good, r_good = scripted_episode(name, right)
        bad, r_bad = scripted_episode(name, miss)
        if (r_good, r_bad) != (1.0, 0.0):
            raise SystemExit(f"{name}: right command scored {r_good}, near miss {r_bad} (want 1.0, 0.0)")
        print(f"{name}: right {r_good} / near miss {r_bad}; observation {good[3]['content']!r}")
        half = args.per_task // 2
        # "tools": [] -- the text-based agent sends no tool schema
        lines += [{"messages": good, "tools": []}] * half
        lines += [{"messages": bad, "tools": []}] * (args.per_task - half)
    random.Random(args.seed).shuffle(lines)
    out = Path(args.out)
    out.write_text("".join(json.dumps(e) + "\n" for e in lines))
    print(f"wrote {len(lines)} episodes to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
