import json,sys
for f in sys.argv[1:]:
    try: d=json.load(open(f))
    except Exception as e: print(f,e); continue
    cal=(d.get('machine') or {}).get('calibration') or {}
    cs=cal.get('before',{}).get('python_loop_ns'),cal.get('after',{}).get('python_loop_ns')
    name=f.split('/')[-1]
    if 'gateway_cpu_us_per_ping' in d:
        print(name, 'ping_us=%s gen_ping_us=%s rss/conn=%s login_us=%s held=%s cal=%s'%(d.get('gateway_cpu_us_per_ping'),d.get('generator_cpu_us_per_ping'),d.get('gateway_rss_per_conn_bytes'),d.get('gateway_cpu_us_per_login'),d.get('connections_held'),cs))
    else:
        for st in d.get('steps',[]):
            print(name, 'rate=%s acked/s=%s p50=%s p99=%s gw=%s db=%s redis=%s gen=%s host=%s%% cal=%s'%(st.get('rate_target'),st.get('acked_per_s'),st.get('ack_p50_ms'),st.get('ack_p99_ms'),st.get('gateway_cpu_us_per_msg'),st.get('mariadb_cpu_us_per_msg'),st.get('redis_cpu_us_per_msg'),st.get('loadgen_cpu_us_per_msg'),st.get('host_cpu_busy_percent'),cs))
