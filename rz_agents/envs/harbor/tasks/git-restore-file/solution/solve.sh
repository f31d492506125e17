#!/bin/bash
set -e
cd /app/repo && git checkout -- config.yaml
