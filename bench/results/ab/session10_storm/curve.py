import json, sys
for f in sys.argv[1:]:
    d = json.load(open(f))
    tl = d['timeline']
    # find kill: first point where drops jump
    k = next(i for i, p in enumerate(tl) if p['drops'] > 0)
    t0 = tl[k]['t']
    marks = {}
    for p in tl[k:]:
        for frac in (0.5, 0.9, 0.99, 0.999, 1.0):
            if frac not in marks and p['held'] >= frac * 100000 and p['drops'] >= 100000:
                marks[frac] = round(p['t'] - t0, 1)
    print(f.split('/')[-1], 'recovery', d['recovery_s'], 'cpu/sync', d['gateway_cpu_us_per_sync'], 'marks', marks, 'err', d['errors'])
