import socket, time, os, resource
ls = socket.socket(); ls.bind(('127.0.0.1', 0)); ls.listen()
a = socket.create_connection(ls.getsockname()); b, _ = ls.accept()
for s in (a, b): s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
N = 50000
r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
for _ in range(N):
    a.send(b'x' * 40); b.recv(100)
t = time.perf_counter() - t; r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
print(f'send+recv on loopback: wall {t/N*1e6:.1f} us, cpu {cpu/N*1e6:.1f} us (sys {(r1.ru_stime-r0.ru_stime)/N*1e6:.1f})')
