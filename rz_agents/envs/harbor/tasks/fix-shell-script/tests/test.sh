#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if grep -q '\$SRC' /app/backup.sh && rm -rf /app/out && bash /app/backup.sh >/dev/null 2>&1 && [ "$(cat /app/out/data.txt.bak)" = important ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
