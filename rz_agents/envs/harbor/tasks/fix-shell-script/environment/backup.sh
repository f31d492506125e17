#!/bin/bash
set -e
SRC=/app/data.txt
DEST_DIR=/app/out
mkdir -p "$DEST_DIR"
cp "$SOURCE" "$DEST_DIR/data.txt.bak"
