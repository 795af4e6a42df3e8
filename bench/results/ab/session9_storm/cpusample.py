"""Sample CPU by process class every second: python cpusample.py OUT.jsonl SECONDS"""
import json, os, sys, time
TCK = os.sysconf("SC_CLK_TCK")
def classify(cmd: str) -> str:
    if "mariadbd" in cmd: return "mariadb"
    if "redis-server" in cmd: return "redis"
    if "beam.smp" in cmd: return "rabbitmq"
    if "bench" in cmd and "imgw" in cmd: return "bench_driver"
    if "multiprocessing" in cmd or "spawn_main" in cmd: return "generator"
    if "imgw" in cmd or "gateway" in cmd: return "gateway"
    if "python" in cmd: return "python_other"
    return "other"
def snap():
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            st = open(f"/proc/{pid}/stat").read()
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
        except OSError: continue
        f = st[st.rfind(")") + 2:].split()
        out[int(pid)] = (classify(cmd), int(f[11]) + int(f[12]), int(f[11]), int(f[12]))
    return out
path, secs = sys.argv[1], float(sys.argv[2])
prev = snap(); t0 = time.time()
with open(path, "w") as fh:
    while time.time() - t0 < secs:
        time.sleep(1.0)
        cur = snap(); tot = {}; usr = {}; sy = {}
        for pid, (c, t, u, s) in cur.items():
            p = prev.get(pid)
            if p is None or p[0] != c: p = (c, 0, 0, 0) if pid not in prev else p
            d = t - (p[1] if pid in prev else 0)
            if pid not in prev: d = t  # new process: all its time
            tot[c] = tot.get(c, 0) + d
            usr[c] = usr.get(c, 0) + u - (prev[pid][2] if pid in prev else 0)
            sy[c] = sy.get(c, 0) + s - (prev[pid][3] if pid in prev else 0)
        fh.write(json.dumps({"t": round(time.time(), 2), "cpu": {k: v / TCK for k, v in tot.items()}, "sys": {k: v / TCK for k, v in sy.items()}}) + "\n"); fh.flush()
        prev = cur
