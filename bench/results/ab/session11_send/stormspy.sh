#!/bin/bash
# stormspy.sh TREE N OUT : storm; py-spy one new worker during recovery
TREE=$1; N=$2; OUT=$3
/tmp/runs/storm.sh $TREE $N $OUT &
sleep 10
OLD=""
for i in $(seq 300); do
  CUR=$(pgrep -f "gateway.cli serve" | sort | tr '\n' ' ')
  if [ -n "$OLD" ] && [ -n "$CUR" ] && [ "$CUR" != "$OLD" ]; then
     # wait for new set to be complete
     sleep 4; CUR=$(pgrep -f "gateway.cli serve" | sort | tr '\n' ' ')
     comm -13 <(echo $OLD | tr ' ' '\n' | sort) <(echo $CUR | tr ' ' '\n' | sort) > $OUT.newpids
     break
  fi
  [ -n "$CUR" ] && OLD=$CUR
  sleep 0.5
done
# pick the busiest new pid (a worker, not the supervisor)
W=$(for p in $(cat $OUT.newpids); do pp=$(awk '{print $4}' /proc/$p/stat); grep -qx $pp $OUT.newpids && echo $p; done | head -1)
echo "spy on $W"
/work/main/.venv/bin/py-spy record -p $W -r 250 -d 10 -f raw -o $OUT.raw --nonblocking >/dev/null 2>&1
wait
