import json, sys
for f in sys.argv[1:]:
    L = [json.loads(l) for l in open(f)]
    # recovery window: find the big negative jump (kill) then until the gateway calms
    ks = ['gateway', 'generator', 'mariadb', 'redis', 'rabbitmq']
    rates = []
    for a, b in zip(L, L[1:]):
        dt = b['t'] - a['t']
        rates.append({k: (b.get(k, 0) - a.get(k, 0)) / dt for k in ks})
    kill = next(i for i, r in enumerate(rates) if r['gateway'] < -100)
    win = [r for r in rates[kill + 3: kill + 28]]
    avg = {k: sum(r[k] for r in win) / len(win) for k in ks}
    print(f.split('/')[-1], ' '.join(f'{k}={v:.0f}' for k, v in avg.items()), 'tot=%.0f' % sum(avg.values()))
