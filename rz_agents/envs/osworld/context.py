"""What setup steps, getters and metrics can reach during one episode (plain data, no logic)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rz_agents.envs.osworld.chrome import ChromeLink
from rz_agents.envs.osworld.client import VMClient


@dataclass
class EpisodeContext:
    """The live episode: the desktop's server, its browser, and local directories.

    ``download_cache`` holds files for ``download`` steps (so tasks run offline when the user
    has them); ``work_dir`` receives files getters copy out of the desktop.
    """

    client: VMClient
    chrome: ChromeLink
    task_id: str
    download_cache: str
    work_dir: str
    allow_network: bool = False
    notes: list[str] = field(default_factory=list)
    # whether the episode's Chromium process is running (None: the provider cannot tell)
    browser_running: Callable[[], bool] | None = None
