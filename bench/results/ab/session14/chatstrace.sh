#!/bin/bash
TREE=$1; OUT=$2; RATE=$3; shift 3
/tmp/runs/chat.sh $TREE $OUT --rates $RATE --duration 30 --warmup 3 "$@" &
sleep 5; for i in $(seq 60); do P=$(pgrep -f "gateway.cli serve" | head -1); [ -n "$P" ] && break; sleep 1; done
sleep 15
timeout 4 strace -tt -p $P -e trace=epoll_pwait,write,read,readv,sendto,recvfrom,writev -s 40 -o $OUT.strace 
wait
