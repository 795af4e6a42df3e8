#!/bin/sh
# The reference run of bench/results/README.md, "TYPING flood": the same flood against
# the gateway before (BEFORE: a checkout of 2f1d4ab) and after (AFTER: c6751c7), on the
# embedded store and on MariaDB + Redis, one after the other; the JSON lines go to
# this folder. Usage: sh bench/results/flood/run.sh BEFORE_TREE AFTER_TREE SECONDS
set -eu
before=$1 after=$2 s=${3:-20}
out=$(dirname "$0")
py=.venv/bin/python
my=mysql://root:@127.0.0.1:3306
rd=redis://127.0.0.1:6379/9
for store in embedded production; do
  if [ $store = production ]; then
    b="--store $my/imgw_flood_before --cache $rd?prefix=floodb:"
    a="--store $my/imgw_flood_after --cache $rd?prefix=flooda:"
  else b="" a=""; fi
  $py -m bench.flood --tree "$before" --seconds "$s" $b > "$out/${store}_before.json"
  $py -m bench.flood --tree "$after" --seconds "$s" $a > "$out/${store}_after.json"
  IMGW_MAX_CONNECTIONS_PER_UID=0 $py -m bench.flood --tree "$after" --seconds "$s" $a \
    > "$out/${store}_after_uncapped.json"
done
