"""`python -m rz_agents.cli ...` is `rz ...` (for scripts that must run this checkout's code)."""

import sys

from rz_agents.cli import main

sys.exit(main())
