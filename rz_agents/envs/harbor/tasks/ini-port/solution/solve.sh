#!/bin/bash
set -e
sed -i '0,/^port = 80$/s//port = 8080/' /app/server.ini
