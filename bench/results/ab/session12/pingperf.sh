#!/bin/bash
# pingperf.sh TREE OUT: connect 15k hb5, perf the gateway during hold
TREE=$1; OUT=$2
/tmp/runs/conn.sh $TREE $OUT --connections 15000 --hb 5 --hold 40 --ramp 5000 &
for i in $(seq 60); do P=$(pgrep -f "gateway.cli serve" | head -1); [ -n "$P" ] && break; sleep 1; done
sleep 15
P=$(pgrep -f "gateway.cli serve" | head -1)
u0=$(awk '{print $14" "$15}' /proc/$P/stat)
perf record -F 999 -g -p $P -o $OUT.perf -- sleep 15 2>/dev/null >/dev/null
u1=$(awk '{print $14" "$15}' /proc/$P/stat)
echo "utime/stime before $u0 after $u1"
wait
