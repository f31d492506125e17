#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if cd /app/repo && [ "$(git log -1 --format=%s 2>/dev/null)" = initial ] && git ls-files --error-unmatch README.md >/dev/null 2>&1; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
