import json, sys
for f in sys.argv[1:]:
    d = json.load(open(f))
    for s in d['steps']:
        sp = s.get('gateway_send_path') or {}
        print(f.split('/')[-1], int(s['rate_target']), s['acked_per_s'], 'p99', s['ack_p99_ms'], 'gw', s['gateway_cpu_us_per_msg'], 'db', s['mariadb_cpu_us_per_msg'], 'redis', s['redis_cpu_us_per_msg'], 'gen', s['loadgen_cpu_us_per_msg'], 'host', s['host_cpu_busy_percent'], 'batch', sp.get('batch_mean'))
