import sys

from rz_agents.cli import main

sys.exit(main())
