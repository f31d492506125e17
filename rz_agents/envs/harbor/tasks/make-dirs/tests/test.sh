#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if [ -d /app/project/src ] && [ -d /app/project/tests ] && [ -d /app/project/docs ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
