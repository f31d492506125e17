"""``rz serve``: the aligned engine behind an OpenAI-compatible HTTP API, with token-exact sessions that
become training trajectories and the RL control API (pause / resume / versioned weight updates).

    server = OpenAIServer(engine, tokenizer, template, model_name="rz")
    with ServerThread(server, options=ServeOptions(api_keys=("k",))) as http:  # or: start_in_loop(server)
        client = openai.OpenAI(base_url=http.url, api_key="k")
"""

from rz_agents.serve.app import InLoopServer, ServerThread, create_app, start_in_loop
from rz_agents.serve.control import RLControl
from rz_agents.serve.openai_schema import OpenAIError
from rz_agents.serve.options import ServeOptions
from rz_agents.serve.server import OpenAIServer
from rz_agents.serve.sessions import Session, SessionPolicy, SessionStore

__all__ = [
    "InLoopServer",
    "OpenAIError",
    "OpenAIServer",
    "RLControl",
    "ServerThread",
    "Session",
    "SessionPolicy",
    "SessionStore",
    "ServeOptions",
    "create_app",
    "start_in_loop",
]
