#!/bin/bash
set -e
cd /app/repo && git reset -q --hard HEAD~1
