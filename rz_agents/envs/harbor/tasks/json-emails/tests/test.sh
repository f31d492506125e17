#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if [ "$(cat /app/emails.txt 2>/dev/null | tr '\n' ,)" = "bo@x.org,zed@x.org," ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
