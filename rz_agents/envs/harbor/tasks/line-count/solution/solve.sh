#!/bin/bash
set -e
wc -l < /app/big.txt > /app/lines.txt
