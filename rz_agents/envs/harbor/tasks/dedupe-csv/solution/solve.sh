#!/bin/bash
set -e
awk '!seen[$0]++' /app/data.csv > /app/clean.csv
