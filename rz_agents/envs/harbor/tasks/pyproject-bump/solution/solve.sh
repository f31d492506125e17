#!/bin/bash
set -e
sed -i 's/^version = "0.1.0"/version = "0.2.0"/' /app/pyproject.toml
