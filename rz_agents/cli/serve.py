"""``rz serve CONFIG|CHECKPOINT [--port P]``: the aligned engine behind an OpenAI-compatible endpoint.

CONFIG is a training config (a YAML path or a packaged name: its model, tokenizer and engine settings;
its checkpoint, or a random tiny model when it has none); CHECKPOINT is an HF checkpoint directory (or a
packaged model name) with its own tokenizer. docs/serve.md is the guide.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rz_agents.cli.flags import add_renamed_flag


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model with the OpenAI API (token-exact sessions, RL control API)",
        description="Serve a config's model or an HF checkpoint over the OpenAI chat/completions API.",
    )
    p.add_argument(
        "target",
        help="a run directory or its final_model (the run's config.yaml + weights), a training config "
        "(YAML or packaged name) or an HF checkpoint directory",
    )
    p.add_argument("overrides", nargs="*", help="key.path=value overrides of a config")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--model-name", default=None, help="the id /v1/models lists (default: the target's name)")
    p.add_argument(
        "--max-running", type=int, default=None, help="sequences decoded at once (engine.max_running)"
    )
    add_renamed_flag(p, "--num-slots", "--max-running", type=int)
    p.add_argument("--max-len", type=int, default=None, help="positions per sequence (engine.max_len)")
    p.set_defaults(func=run)


def build_server(target: str, overrides: list[str] | None = None, model_name: str | None = None, **engine):
    """(OpenAIServer, its engine) for a config or a checkpoint; ``engine``: EngineConfig field overrides."""
    from rz_agents.cli.run_dir import resolve_run_target
    from rz_agents.engine import EngineConfig, RZEngine
    from rz_agents.serve import OpenAIServer

    run = resolve_run_target(target)  # a run directory or its final_model: the run's config + its weights
    if run is not None:
        if run.checkpoint is None:
            raise ValueError(f"{target}: the run has no final_model yet (rz train writes it at the end)")
        overrides = [*(overrides or []), f"model.checkpoint={run.checkpoint}"]
        model_name, target = model_name or run.config.parent.name, str(run.config)
    path = Path(target)
    if (path / "config.json").is_file() or _is_packaged_model(target):
        from rz_agents.model.checkpoint import load_hf_checkpoint
        from rz_agents.model.packaged import resolve_checkpoint
        from rz_agents.runtime.factories import build_tokenizer

        directory = resolve_checkpoint(target)
        tokenizer, template = build_tokenizer("checkpoint", str(directory))
        model = load_hf_checkpoint(directory, kernels="aligned")
        config = EngineConfig(**{k: v for k, v in engine.items() if v is not None})
        name = model_name or path.name
    else:
        from rz_agents.cli.train import load_run_config
        from rz_agents.runtime.factories import build_model, build_tokenizer, vocab_size

        cfg = load_run_config(target, overrides, validate=False)
        plan = cfg.validate()  # the config's one resolve
        tokenizer, template = build_tokenizer(cfg.tokenizer, cfg.model.checkpoint)
        model = build_model(cfg.model, vocab_size(cfg.tokenizer, tokenizer))
        config = dataclasses.replace(plan.engine, **{k: v for k, v in engine.items() if v is not None})
        name = model_name or Path(target).stem
    model.requires_grad_(False)
    rz_engine = RZEngine(model.eval(), config, decode=tokenizer.decode)
    return OpenAIServer(rz_engine, tokenizer, template, model_name=name), rz_engine


def _is_packaged_model(name: str) -> bool:
    from rz_agents.model.packaged import PACKAGED_MODELS

    return name in PACKAGED_MODELS


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    import uvicorn

    from rz_agents.serve import create_app

    try:
        server, engine = build_server(
            args.target, args.overrides, args.model_name, max_running=args.max_running, max_len=args.max_len
        )
    except (ValueError, FileNotFoundError) as exc:  # ConfigError is a ValueError: one line, exit 2
        print(f"rz serve: cannot serve {args.target}: {exc}", file=sys.stderr)
        return 2
    print(
        f"rz serve: {server.model_name} on http://{args.host}:{args.port}/v1 "
        f"(engine: max_running {engine.config.max_running}, max_len {engine.config.max_len}, "
        f"version {engine.version})",
        file=sys.stderr,
    )
    uvicorn.run(create_app(server), host=args.host, port=args.port, log_level="warning")
    return 0
