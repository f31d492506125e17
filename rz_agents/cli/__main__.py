"""``python -m rz_agents.cli`` = ``rz``."""

import sys

from rz_agents.cli import main

sys.exit(main())
