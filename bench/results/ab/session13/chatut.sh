#!/bin/bash
# chatut.sh TREE OUT RATE [extra]: chat at RATE for 30 s; gateway user/system ticks over 10 s
TREE=$1; OUT=$2; RATE=$3; shift 3
/tmp/runs/chat.sh $TREE $OUT --rates $RATE --duration 30 --warmup 3 "$@" &
sleep 5; for i in $(seq 60); do P=$(pgrep -f "gateway.cli serve" | head -1); [ -n "$P" ] && break; sleep 1; done
sleep 15
read u0 s0 < <(awk '{print $14, $15}' /proc/$P/stat); c0=$(grep ctxt /proc/$P/status | awk '{s+=$2} END {print s}')
sleep 10
read u1 s1 < <(awk '{print $14, $15}' /proc/$P/stat); c1=$(grep ctxt /proc/$P/status | awk '{s+=$2} END {print s}')
echo "user ticks/s $(( (u1-u0)/10 )) sys ticks/s $(( (s1-s0)/10 )) ctxsw/s $(( (c1-c0)/10 ))" > $OUT.ut
wait
