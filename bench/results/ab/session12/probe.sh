#!/bin/bash
# probe.sh TREE KIND OUT: the connect bench against bench.transport_probe
TREE=$1; KIND=$2; OUT=$3
cd $TREE
exec 9>/tmp/bench.lock; flock 9
.venv/bin/python -m bench.transport_probe --kind $KIND --port 7420 > $OUT.probe.log 2>&1 &
P=$!
sleep 2
timeout 600 .venv/bin/imgw bench connect --addr 127.0.0.1:7420 --token-key k:s --gateway-pid $P \
  --connections 15000 --hb 5 --hold 45 --ramp 5000 --no-charts --json $OUT.json > $OUT.log 2>&1
echo "rc=$?" >> $OUT.log
kill -9 $P
