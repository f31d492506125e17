#!/bin/bash
# writes 1 to /logs/verifier/reward.txt when the task is done, else 0
if [ "$(ls /app/photos | sort | tr '\n' ' ')" = "IMG_001.jpg IMG_002.jpg IMG_003.jpg IMG_004.jpg " ] && [ "$(cat /app/photos/IMG_003.jpg)" = img3 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
