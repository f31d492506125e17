#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if mkdir -p /tmp/x && tar xzf /app/backup.tar.gz -C /tmp/x 2>/dev/null && [ "$(cat /tmp/x/docs/guide/one.md)" = step ] && [ "$(cat /tmp/x/docs/README)" = intro ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
