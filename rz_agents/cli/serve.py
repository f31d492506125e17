"""``rz serve CONFIG|CHECKPOINT [--port P]``: the aligned engine behind an OpenAI-compatible endpoint.

CONFIG is a training config (a YAML path or a packaged name: its model, tokenizer and engine settings;
its checkpoint, or a random tiny model when it has none); CHECKPOINT is an HF checkpoint directory (or a
packaged model name) with its own tokenizer. docs/serve.md is the guide.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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
    _add_access_flags(p)
    p.set_defaults(func=run)


def _add_access_flags(p: argparse.ArgumentParser) -> None:
    """Keys, the control routes, allowed hosts and origins, caps and timeouts (serve/options.py)."""
    from rz_agents.serve.options import API_KEY_ENV, CONTROL_KEY_ENV, ServeOptions

    d = ServeOptions()
    a = p.add_argument_group("access and limits (docs/serve.md#security)")
    a.add_argument(
        "--api-key",
        action="append",
        default=None,
        help=f"a Bearer key every route needs (repeat for several; default: ${API_KEY_ENV}, comma-separated)",
    )
    a.add_argument(
        "--control",
        action="store_true",
        help="mount the RL control routes (pause, resume, update_weights, ...); they need --control-key",
    )
    a.add_argument(
        "--control-key", default=None, help=f"the control routes' key (default: ${CONTROL_KEY_ENV})"
    )
    a.add_argument(
        "--weights-dir", default=None, help="/update_weights reads only paths inside this directory"
    )
    a.add_argument(
        "--allow-host",
        action="append",
        default=None,
        help="a Host name served besides the bound one ('*': any; default: loopback names on loopback)",
    )
    a.add_argument("--allow-origin", action="append", default=[], help="a browser Origin allowed")
    a.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="largest request body")
    a.add_argument(
        "--max-request-sequences", type=int, default=d.max_request_sequences, help="prompts x n per request"
    )
    a.add_argument("--body-timeout", type=float, default=d.body_timeout_s, help="seconds to receive a body")
    a.add_argument(
        "--header-timeout", type=float, default=d.header_timeout_s, help="seconds to receive a request head"
    )
    a.add_argument(
        "--idle-timeout", type=float, default=d.idle_timeout_s, help="seconds an idle keep-alive stays open"
    )
    a.add_argument(
        "--session-records",
        action="store_true",
        help="GET /v1/sessions/ID returns a session's tokens to its owner",
    )
    a.add_argument(
        "--strict-fields", action="store_true", help="refuse unknown request fields (default: ignore)"
    )


def serve_options(args: argparse.Namespace):
    """ServeOptions from the parsed flags and the key environment variables."""
    from rz_agents.serve.options import API_KEY_ENV, CONTROL_KEY_ENV, ServeOptions, keys_from_env

    keys = tuple(args.api_key) if args.api_key else keys_from_env(os.environ.get(API_KEY_ENV))
    control_key = args.control_key or os.environ.get(CONTROL_KEY_ENV) or None
    if args.control and not control_key:
        raise ValueError(
            f"--control needs --control-key (or ${CONTROL_KEY_ENV}): the control routes have their own key"
        )
    return ServeOptions(
        host=args.host,
        api_keys=keys,
        control_key=control_key if args.control else None,
        allowed_hosts=tuple(args.allow_host) if args.allow_host else None,
        allowed_origins=tuple(args.allow_origin),
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout,
        header_timeout_s=args.header_timeout,
        idle_timeout_s=args.idle_timeout,
        max_request_sequences=args.max_request_sequences,
        session_records=args.session_records,
        strict_fields=args.strict_fields,
    )


def build_server(target: str, overrides: list[str] | None = None, model_name: str | None = None, **engine):
    """(OpenAIServer, its engine) for a config or a checkpoint; ``engine``: EngineConfig field overrides."""
    from rz_agents.cli.run_dir import resolve_run_target
    from rz_agents.engine import EngineConfig, RZEngine
    from rz_agents.serve import OpenAIServer

    if _is_packaged_model(target):  # its directory: an HF checkpoint, or a run's final_model
        from rz_agents.model.packaged import resolve_checkpoint

        target, model_name = str(resolve_checkpoint(target)), model_name or target
    run = resolve_run_target(target)  # a run directory or its final_model: the run's config + its weights
    if run is not None:
        if run.checkpoint is None:
            raise ValueError(f"{target}: the run has no final_model yet (rz train writes it at the end)")
        overrides = [*(overrides or []), f"model.checkpoint={run.checkpoint}"]
        model_name, target = model_name or run.config.parent.name, str(run.config)
    path = Path(target)
    if (path / "config.json").is_file():
        from rz_agents.model.checkpoint import load_hf_checkpoint
        from rz_agents.runtime.factories import build_tokenizer

        directory = path
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
    from rz_agents.runtime.factories import policy_template

    # a vision-language policy's template renders image parts (the engine gets their pixels)
    template = policy_template(template, getattr(model, "vl_config", None))
    model.requires_grad_(False)
    _check_max_len(config.max_len, model)
    rz_engine = RZEngine(model.eval(), config, decode=tokenizer.decode)
    return OpenAIServer(rz_engine, tokenizer, template, model_name=name), rz_engine


def _check_max_len(max_len: int, model) -> None:
    """Refuse a max_len beyond the positions the model has: a prompt that long would fail in the forward."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if positions is not None and max_len > positions:
        raise ValueError(
            f"max_len {max_len} is beyond the model's {positions} positions (max_position_embeddings); "
            f"use --max-len {positions} or less"
        )


def _is_packaged_model(name: str) -> bool:
    from rz_agents.model.packaged import PACKAGED_MODELS

    return name in PACKAGED_MODELS


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from rz_agents.serve import RLControl, create_app
    from rz_agents.serve.options import warn_if_exposed
    from rz_agents.serve.uvicorn_server import uvicorn_server

    try:
        options = serve_options(args)
        server, engine = build_server(
            args.target, args.overrides, args.model_name, max_running=args.max_running, max_len=args.max_len
        )
    except (ValueError, FileNotFoundError) as exc:  # ConfigError is a ValueError: one line, exit 2
        print(f"rz serve: cannot serve {args.target}: {exc}", file=sys.stderr)
        return 2
    control = RLControl(engine, weights_dir=args.weights_dir) if args.control else None
    warn_if_exposed(options)
    print(
        f"rz serve: {server.model_name} on http://{args.host}:{args.port}/v1 "
        f"(engine: max_running {engine.config.max_running}, max_len {engine.config.max_len}, "
        f"version {engine.version})",
        file=sys.stderr,
    )
    uvicorn_server(create_app(server, control, options), options, args.port).run()
    return 0
