"""Sample utime+stime (clock ticks) per process class once a second -> jsonl."""
import json, os, sys, time
out = open(sys.argv[1], "w")
def cls(cmd: str, comm: str) -> str | None:
    if comm == "mariadbd": return "mariadb"
    if comm == "redis-server": return "redis"
    if comm in ("beam.smp", "erl_child_setup"): return "rabbitmq"
    if "multiprocessing" in cmd or "holders" in cmd: return "generator"
    if "imgw" in cmd or "bench" in cmd or "gateway" in cmd:
        if " serve" in cmd or "supervisor" in cmd or "worker" in cmd: return "gateway"
        if "holders" in cmd or "fleet" in cmd or "loadclient" in cmd: return "generator"
        return "bench_driver"
    return None
while True:
    rec = {"t": time.time()}
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f: cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f: st = f.read()
        except OSError: continue
        comm = st[st.index("(")+1:st.rindex(")")]
        c = cls(cmd, comm)
        if c is None: continue
        fields = st[st.rindex(")")+2:].split()
        rec[c] = rec.get(c, 0) + int(fields[11]) + int(fields[12])
    out.write(json.dumps(rec) + "\n"); out.flush()
    time.sleep(1)
