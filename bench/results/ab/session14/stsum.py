import json,sys
for f in sys.argv[1:]:
    try: d=json.load(open(f))
    except Exception as e: print(f, e); continue
    print(f.split('/')[-1], 'rec=%s unav_max=%s over2=%s errors=%s cpu/sync=%s lo=%s held=%s cal=%s' % (d.get('recovery_s'), d.get('told_unavailable_max'), d.get('clients_told_unavailable_over_2'), d.get('errors'), d.get('gateway_cpu_us_per_sync'), d.get('listen_overflows'), d.get('connections_held'), d.get('machine',{}).get('calibration')))
    print('   ', d.get('error_kinds') or {k:v for k,v in d.items() if 'unavail' in k or 'error' in k})
