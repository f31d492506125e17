#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if [ "$(cat /app/clean.csv 2>/dev/null | tr '\n' ' ')" = "k,v b,2 a,1 c,3 " ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
