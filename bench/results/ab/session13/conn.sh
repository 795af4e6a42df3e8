#!/bin/bash
# conn.sh TREE OUT [args]
TREE=$1; OUT=$2; shift 2
cd $TREE
exec 9>/tmp/bench.lock; flock 9
timeout 1800 .venv/bin/imgw bench connect --spawn-gateway --no-charts --json $OUT.json "$@" > $OUT.log 2>&1
echo "rc=$?" >> $OUT.log
