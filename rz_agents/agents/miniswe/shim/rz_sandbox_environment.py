"""A mini-swe-agent environment class whose commands run in an rz episode's sandbox.

This file is imported by mini-swe-agent's own interpreter (its venv), never by rz: it has no rz import and
no dependency beyond the standard library. rz puts this folder on that interpreter's ``PYTHONPATH`` and
names the class in the episode's mini-swe-agent config (``environment.environment_class:
rz_sandbox_environment.RzSandboxEnvironment``, with ``url`` and ``token``); mini-swe-agent itself is run
unchanged. Each ``execute`` posts the command to the episode's command endpoint
(rz_agents/agents/miniswe/command_endpoint.py), which runs it in the task's bubblewrap workspace with the
task's limits and answers with its output and exit code.

The finishing protocol is mini-swe-agent's own (as in its LocalEnvironment): a command whose output starts
with the line ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` and exits 0 submits.
"""

from __future__ import annotations

import json
import platform
import urllib.error
import urllib.request
from typing import Any

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class RzSandboxEnvironment:
    """Executes mini-swe-agent's actions through the rz episode's command endpoint (``url``, ``token``)."""

    def __init__(self, *, url: str, token: str, timeout: int = 30, cwd: str = "", **extra: Any) -> None:
        self.config = {"url": url, "token": token, "timeout": int(timeout), "cwd": cwd, **extra}

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run ``action["command"]`` in the sandbox: ``{"output", "returncode", "exception_info"}``."""
        body = {"command": action.get("command", ""), "timeout": timeout or self.config["timeout"]}
        request = urllib.request.Request(
            self.config["url"],
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.config['token']}"},
            method="POST",
        )
        try:
            # the endpoint enforces the command's own wall time: this bound only guards a lost endpoint
            with urllib.request.urlopen(request, timeout=float(body["timeout"]) + 60.0) as response:
                result = json.loads(response.read().decode())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            detail = exc.read().decode(errors="replace") if isinstance(exc, urllib.error.HTTPError) else ""
            result = {"output": "", "returncode": -1, "error": f"the sandbox did not run it: {exc} {detail}"}
        output = {
            "output": result.get("output", ""),
            "returncode": result.get("returncode", -1),
            "exception_info": result.get("error") or "",
        }
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict) -> None:
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            from minisweagent.exceptions import Submitted  # mini-swe-agent's own (this runs in its venv)

            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """Variables for mini-swe-agent's prompt templates (its LocalEnvironment's, less the host's env)."""
        public = {k: v for k, v in self.config.items() if k != "token"}
        return {**public, **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict:
        """What mini-swe-agent saves of the environment in its trajectory file (no token)."""
        public = {k: v for k, v in self.config.items() if k != "token"}
        kind = f"{type(self).__module__}.{type(self).__name__}"
        return {"info": {"config": {"environment": public, "environment_type": kind}}}
