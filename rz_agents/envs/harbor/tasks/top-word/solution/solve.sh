#!/bin/bash
set -e
tr -cs 'A-Za-z' '\n' < /app/text.txt | tr 'A-Z' 'a-z' | grep . | sort | uniq -c | sort -rn | head -1 | awk '{print $2}' > /app/top.txt
