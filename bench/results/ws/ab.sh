#!/bin/sh
# The WebSocket library A/B: each probe kind (python -m bench.ws_probe) held with 15,000
# idle logged-in connections (a PING every 5 s), then echoing 2,000 SEND-sized messages a
# second; kinds alternate, the order rotated each round. Run from the repository root:
#   sh bench/results/ws/ab.sh 3        # rounds (3)
set -e
OUT=bench/results/ws
PORT=7411
ROUNDS=${1:-3}
order() {
    case $1 in
    1) echo websockets aiohttp wsproto tcp ;;
    2) echo aiohttp wsproto tcp websockets ;;
    *) echo wsproto tcp websockets aiohttp ;;
    esac
}
for r in $(seq 1 "$ROUNDS"); do
    for kind in $(order "$r"); do
        .venv/bin/python -m bench.ws_probe --kind "$kind" --port $PORT >/dev/null 2>&1 &
        pid=$!
        sleep 2
        if [ "$kind" = tcp ]; then t=tcp; url=tcp://127.0.0.1:$PORT; else t=ws; url=ws://127.0.0.1:$PORT/ws; fi
        .venv/bin/imgw bench connect --transport $t --addr 127.0.0.1:$PORT --token-key k:s \
            --gateway-pid $pid --connections 15000 --ramp 5000 --hb 5 --hold 45 --no-charts \
            --json $OUT/ab_connect_${kind}_$r.json >/dev/null 2>&1 || echo "connect $kind $r failed"
        rm -f $OUT/ab_connect_${kind}_$r.md
        .venv/bin/python -m bench.ws_probe --echo $url --pid $pid --rate 2000 --duration 20 \
            --json $OUT/ab_echo_${kind}_$r.json >/dev/null || echo "echo $kind $r failed"
        kill $pid
        wait $pid || true
        sleep 2
    done
done
