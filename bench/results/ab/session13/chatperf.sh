#!/bin/bash
# chatperf.sh TREE OUT RATE [extra]: chat at RATE 30 s; perf record the gateway 10 s
TREE=$1; OUT=$2; RATE=$3; shift 3
/tmp/runs/chat.sh $TREE $OUT --rates $RATE --duration 30 --warmup 3 "$@" &
sleep 5; for i in $(seq 60); do P=$(pgrep -f "gateway.cli serve" | head -1); [ -n "$P" ] && break; sleep 1; done
sleep 15
perf record -F 999 -p $P -o $OUT.perf -- sleep 10 2>/dev/null >/dev/null
wait
