#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if python3 -c "import configparser,sys; c=configparser.ConfigParser(); c.read('/app/server.ini'); sys.exit(0 if c['server']['port']=='8080' and c['admin']['port']=='9000' else 1)"; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
