#!/bin/bash
# chatsys.sh TREE OUT RATE: chat at RATE 30 s; count the gateway's syscalls for 10 s
TREE=$1; OUT=$2; RATE=$3; shift 3
/tmp/runs/chat.sh $TREE $OUT --rates $RATE --duration 30 --warmup 3 "$@" &
sleep 5; for i in $(seq 60); do P=$(pgrep -f "gateway.cli serve" | head -1); [ -n "$P" ] && break; sleep 1; done
sleep 15
perf stat -e 'raw_syscalls:sys_enter' -e 'syscalls:sys_enter_epoll_pwait' -e 'syscalls:sys_enter_epoll_wait' -e 'syscalls:sys_enter_write' -e 'syscalls:sys_enter_read' -e 'syscalls:sys_enter_readv' -e 'syscalls:sys_enter_writev' -e 'syscalls:sys_enter_getpid' -e 'syscalls:sys_enter_sendto' -e 'syscalls:sys_enter_recvfrom' -e 'context-switches' -p $P -- sleep 10 2> $OUT.sys
wait
