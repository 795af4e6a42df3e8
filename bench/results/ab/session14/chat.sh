#!/bin/bash
# chat.sh TREE OUT [args]
TREE=$1; OUT=$2; shift 2
cd $TREE
exec 9>/tmp/bench.lock; flock 9
timeout 900 .venv/bin/imgw bench chat --spawn-gateway --store mysql://root:@127.0.0.1:3306/ --cache redis://127.0.0.1:6379/0 --no-charts --json $OUT.json "$@" > $OUT.log 2>&1
echo "rc=$?" >> $OUT.log
