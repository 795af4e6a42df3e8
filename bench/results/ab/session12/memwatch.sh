#!/bin/bash
# memwatch.sh LOG: log MemAvailable every 10 s; below 900 MB stop the connect bench
while pgrep -f "bench connect" >/dev/null; do
  a=$(awk '/MemAvailable/ {print int($2/1024)}' /proc/meminfo)
  echo "$(date +%T) avail_mb=$a" >> $1
  if [ "$a" -lt 900 ]; then echo "$(date +%T) LOW MEMORY: stopping the bench" >> $1; pkill -INT -f "bench connect"; sleep 30; fi
  sleep 10
done
