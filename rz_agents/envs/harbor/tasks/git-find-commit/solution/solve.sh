#!/bin/bash
set -e
cd /app/repo && git log --grep=overflow --format=%H > /app/answer.txt
