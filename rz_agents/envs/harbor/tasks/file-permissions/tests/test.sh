#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if [ -x /app/run.sh ] && [ "$(stat -c %a /app/secret.txt)" = 600 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
