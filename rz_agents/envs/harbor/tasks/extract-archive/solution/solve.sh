#!/bin/bash
set -e
mkdir -p /app/out && tar xzf /app/bundle.tar.gz -C /app/out
