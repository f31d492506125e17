#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if cd /app && python3 -c "import sys; sys.path.insert(0, '/app'); from strutil import reverse_words as r; sys.exit(0 if r('a b c') == 'c b a' and r('one') == 'one' and r('x  y') == 'y  x' else 1)" 2>/dev/null; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
