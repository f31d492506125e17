#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if [ "$(python3 /app/calc.py 2>/dev/null)" = 42 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
