#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if cd /app/repo && [ "$(git show feature:feature.txt 2>/dev/null)" = "new feature" ] && ! git cat-file -e main:feature.txt 2>/dev/null && [ "$(git log -1 --format=%s main)" = docs ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
