#!/bin/bash
set -e
cd /app/repo && git tag v1.0
