#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if cd /app/repo && [ "$(tr -d '[:space:]' < /app/answer.txt 2>/dev/null)" = "$(git log --grep=overflow --format=%H)" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
