#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if [ "$(cat /app/doc.md)" = "$(printf '# Colour guide\nPick a color.\nThe color of the sky.')" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
