"""Evaluate the OpenAI-SDK example agent against any OpenAI-compatible endpoint (``rz serve`` of a trained
checkpoint, or of the untrained policy): the mean of its scorer over N episodes.

    rz serve configs/openai-agent.yaml model.checkpoint=RUN/final_model --port 8011 &
    python experiments/openai_agent/eval_agent.py --base-url http://127.0.0.1:8011/v1 --episodes 64

Each episode runs in its own session (``X-RZ-Session``), as in training, so the conversation the policy sees
is token-exact; the agent code is the one trained (rz_agents/agents/examples/openai_letters_agent.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics

import openai

from rz_agents.agents.examples.openai_letters_agent import agent, score


def _episode(base_url: str, i: int) -> float:
    client = openai.OpenAI(base_url=base_url, api_key="rz", default_headers={"X-RZ-Session": f"eval-{i}"})
    task: dict = {}
    replies = agent(client, task)
    # the scorer reads the assistant turns of the conversation: exactly the replies the agent returns
    return score(task, replies, [{"role": "assistant", "content": r} for r in replies])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        rewards = list(pool.map(lambda i: _episode(args.base_url, i), range(args.episodes)))
    print(json.dumps({"episodes": len(rewards), "mean_reward": round(statistics.fmean(rewards), 4)}))


if __name__ == "__main__":
    main()
