"""Episodes that make a tiny policy depend on a few-shot prompt, as small instruct models do.

With the few-shot system prompt, the demonstrations solve KeyLookup (call the tool, answer its code);
without it, they answer "?" at once (reward 0). A policy fine-tuned on this mixture scores 0 on the env
as it is, and sometimes succeeds when the few-shot prompt is given: the situation the rejection-sampling
bootstrap (warm_start.bootstrap) is for.

    python make_policy_data.py OUT_DIR
"""

import json
import sys
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial"
FEW_SHOT = "Example: Code of q? Ask: lookup KEY -> you: lookup q -> tool: x -> you: x"


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for line in (TUTORIAL / "episodes.jsonl").read_text().splitlines():
        messages = json.loads(line)["messages"]
        rows.append({"messages": [{"role": "system", "content": FEW_SHOT}, *messages]})
        rows.append({"messages": [messages[0], {"role": "assistant", "content": "?"}]})
    (out / "prompt_dependent.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "few_shot.txt").write_text(FEW_SHOT)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
