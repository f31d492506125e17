#!/bin/bash
set -e
sed -i 's/\[::1\]/[::-1]/' /app/strutil.py
