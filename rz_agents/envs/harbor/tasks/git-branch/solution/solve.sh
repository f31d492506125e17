#!/bin/bash
set -e
cd /app/repo && git checkout -q -b feature main && echo 'new feature' > feature.txt && git add feature.txt && git commit -q -m 'add feature'
