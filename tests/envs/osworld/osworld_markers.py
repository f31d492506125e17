"""Skip markers the desktop tests share: what each needs installed on the machine."""

from __future__ import annotations

import shutil

import pytest

from rz_agents.envs.osworld.session import atspi_problem

needs_atspi = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("chromium")) or atspi_problem() is not None,
    reason=f"needs xvfb, chromium and AT-SPI ({atspi_problem()}; scripts/install.sh installs them)",
)
