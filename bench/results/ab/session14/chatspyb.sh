#!/bin/bash
# chatspy.sh TREE OUT RATE [extra]: chat at RATE for 30 s, py-spy 10 s of the gateway
TREE=$1; OUT=$2; RATE=$3; shift 3
/tmp/runs/chat.sh $TREE $OUT --rates $RATE --duration 40 --warmup 3 "$@" &
sleep 5; for i in $(seq 60); do P=$(pgrep -f "gateway.cli serve" | head -1); [ -n "$P" ] && break; sleep 1; done
sleep 15
/work/main/.venv/bin/py-spy record -p $P -r 200 -d 20 -f raw -o $OUT.raw $SPYARGS >/dev/null 2>&1
wait
