import socket, time, os, resource, sys
gap = float(sys.argv[1]); N = int(sys.argv[2])
ls = socket.socket(); ls.bind(('127.0.0.1', 0)); ls.listen()
pid = os.fork()
if pid == 0:
    c = socket.create_connection(ls.getsockname()); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(N):
        c.send(b'x'); c.recv(10)
        if gap: time.sleep(gap)
    os._exit(0)
b, _ = ls.accept(); b.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
for _ in range(N):
    b.recv(10); b.send(b'y')
t = time.perf_counter() - t; r1 = resource.getrusage(resource.RUSAGE_SELF)
os.waitpid(pid, 0)
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
print(f'gap {gap*1000:.1f} ms: echo side cpu/msg {cpu/N*1e6:.1f} us (sys {(r1.ru_stime-r0.ru_stime)/N*1e6:.1f}); client cpu/msg {(ch.ru_utime+ch.ru_stime)/N*1e6:.1f} us; wall/msg {t/N*1e6:.0f} us')
