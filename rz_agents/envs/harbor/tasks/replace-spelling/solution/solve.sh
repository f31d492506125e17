#!/bin/bash
set -e
sed -i 's/colour/color/g' /app/doc.md
