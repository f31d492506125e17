#!/bin/bash
# reward 1 when /app/hello.txt holds exactly one line: Hello, world!
if [ "$(cat /app/hello.txt 2>/dev/null)" = "Hello, world!" ] && [ "$(wc -l < /app/hello.txt)" -le 1 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
