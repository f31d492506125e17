#!/bin/bash
set -e
mkdir -p /app/project/src /app/project/tests /app/project/docs
