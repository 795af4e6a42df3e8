#!/bin/sh
# The gateway over WebSocket against plain TCP, alternating, one series: idle memory and
# CPU per PING (15,000 connections, a PING every 5 s, held 45 s), then chat (p2p sends at
# 1,000 and 2,000 msg/s, embedded store). Run from the repository root:
#   sh bench/results/ws/gateway.sh 3        # rounds (3)
set -e
OUT=bench/results/ws
ROUNDS=${1:-3}
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then order="ws tcp"; else order="tcp ws"; fi
    for t in $order; do
        .venv/bin/imgw bench connect --transport $t --connections 15000 --hb 5 --hold 45 \
            --ramp 5000 --spawn-gateway --no-charts --json $OUT/gw_connect_${t}_$r.json \
            >/dev/null 2>&1 || echo "connect $t $r failed"
        rm -f $OUT/gw_connect_${t}_$r.md
    done
    for t in $order; do
        .venv/bin/imgw bench chat --transport $t --rates 1000,2000 --duration 20 --warmup 3 \
            --spawn-gateway --no-charts --json $OUT/gw_chat_${t}_$r.json \
            >/dev/null 2>&1 || echo "chat $t $r failed"
        rm -f $OUT/gw_chat_${t}_$r.md
    done
done
