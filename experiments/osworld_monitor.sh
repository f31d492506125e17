#!/bin/bash
# every 20 s: time, the learner actor's and the engine's RSS (MiB), desktops (Xvfb pids), load, free memory
while true; do
  l=$(ps -eo rss,args | awk '/ray::LearnerRank/ && !/awk/{s+=$1} END{print int(s/1024)}')
  e=$(ps -eo rss,args | awk '/ray::EngineServer/ && !/awk/{s+=$1} END{print int(s/1024)}')
  x=$(pgrep -d, Xvfb); echo "$(date +%T) learner_mib=$l engine_mib=$e xvfb_pids=$x load=$(cut -d' ' -f1 /proc/loadavg) avail_mib=$(awk '/MemAvailable/{print int($2/1024)}' /proc/meminfo)"
  sleep 20
done
