#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if [ "$(python3 /app/cli.py 2 5 -1 2>/dev/null)" = 6 ] && [ "$(python3 /app/cli.py 2>/dev/null)" = 0 ] && [ "$(python3 /app/cli.py 100 23 2>/dev/null)" = 123 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
