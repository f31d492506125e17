#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if python3 -c "import tomllib,sys; d=tomllib.load(open('/app/pyproject.toml','rb'))['project']; sys.exit(0 if d['version']=='0.2.0' and d['name']=='demo' else 1)"; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
