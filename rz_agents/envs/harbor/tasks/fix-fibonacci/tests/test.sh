#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if cd /app && python3 -c "import sys; from fib import fib; sys.exit(0 if [fib(i) for i in (0, 1, 2, 10, 20)] == [0, 1, 1, 55, 6765] else 1)" 2>/dev/null; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
