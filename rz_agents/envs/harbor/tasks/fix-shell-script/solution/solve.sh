#!/bin/bash
set -e
sed -i 's/\$SOURCE/$SRC/' /app/backup.sh && bash /app/backup.sh
