#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if cd /app/repo && [ "$(git rev-parse v1.0^{commit} 2>/dev/null)" = "$(git rev-parse HEAD)" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
