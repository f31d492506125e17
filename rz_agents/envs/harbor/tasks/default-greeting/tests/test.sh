#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if [ "$(env -u NAME bash /app/greet.sh)" = "Hello, world" ] && [ "$(NAME=Ann bash /app/greet.sh)" = "Hello, Ann" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
