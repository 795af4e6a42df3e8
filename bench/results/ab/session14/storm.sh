#!/bin/bash
# storm.sh TREE N OUT [extra args]
TREE=$1; N=$2; OUT=$3; shift 3
cd $TREE
exec 9>/tmp/bench.lock; flock 9
python3 /tmp/runs/cpusample.py $OUT.cpu.jsonl & SP=$!
nstat -n >/dev/null
timeout 900 .venv/bin/imgw bench storm --connections $N --ramp 3000 --how kill --spawn-gateway \
  --store mysql://root:@127.0.0.1:3306/ --cache redis://127.0.0.1:6379/0 \
  --bus amqp://guest:guest@127.0.0.1:5672/ --no-charts --json $OUT.json "$@" > $OUT.log 2>&1
echo "rc=$?" >> $OUT.log
nstat | grep -E "ListenOverflow|ListenDrops" >> $OUT.log
kill $SP
