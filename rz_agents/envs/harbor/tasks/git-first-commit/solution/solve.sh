#!/bin/bash
set -e
cd /app/repo && git -c init.defaultBranch=main init -q && git add README.md && git commit -q -m initial
