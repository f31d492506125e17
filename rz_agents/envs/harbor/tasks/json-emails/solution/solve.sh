#!/bin/bash
set -e
python3 -c "import json; print('\n'.join(sorted(u['email'] for u in json.load(open('/app/users.json')) if u['active'])))" > /app/emails.txt
