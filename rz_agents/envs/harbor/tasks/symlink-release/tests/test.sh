#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if [ -L /app/current ] && [ "$(readlink -f /app/current)" = /app/releases/v2 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
