#!/bin/bash
set -e
sed -i 's/\$NAME/${NAME:-world}/' /app/greet.sh
