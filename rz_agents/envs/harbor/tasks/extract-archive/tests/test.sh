#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if [ "$(cat /app/out/docs/a.txt 2>/dev/null)" = alpha ] && [ "$(cat /app/out/b.txt 2>/dev/null)" = beta ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
