#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if cd /app/repo && [ "$(git log -1 --format=%s)" = "fix overflow in parser" ] && [ "$(cat app.txt)" = v2 ] && [ -z "$(git status --porcelain)" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
