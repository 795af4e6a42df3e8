#!/bin/bash
# chatprobe.sh TREE OUT RATE : run chat at RATE for 30 s, probe gateway ctx switches + perf
TREE=$1; OUT=$2; RATE=$3
/tmp/runs/chat.sh $TREE $OUT --rates $RATE --duration 30 --warmup 3 &
sleep 5; for i in $(seq 60); do P=$(pgrep -f "gateway.cli serve" | head -1); [ -n "$P" ] && break; sleep 1; done
P=$(pgrep -f "gateway.cli serve" | head -1)
sleep 15
ps -o pid,args -p $P | cut -c1-150
s0=$(grep ctxt /proc/$P/status | awk '{s+=$2} END {print s}'); t0=$(awk '{print $14+$15}' /proc/$P/stat)
/work/main/.venv/bin/py-spy record -p $P -r 200 -d 10 -f raw -o $OUT.raw --nonblocking >/dev/null 2>&1
s1=$(grep ctxt /proc/$P/status | awk '{s+=$2} END {print s}'); t1=$(awk '{print $14+$15}' /proc/$P/stat)
echo "ctxsw/s $(( (s1-s0)/8 )) cpu ticks/s $(( (t1-t0)/8 ))"
wait
