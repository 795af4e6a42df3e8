import sys, collections, re
by_file = collections.Counter(); by_func = collections.Counter(); total = 0
for line in open(sys.argv[1]):
    line = line.rstrip()
    if not line: continue
    stack, _, n = line.rpartition(' ')
    n = int(n); total += n
    leaf = stack.split(';')[-1]
    m = re.match(r'(.*) \((.*?):\d+\)$', leaf)
    fn, path = (m.group(1), m.group(2)) if m else (leaf, '?')
    p = path
    for key in ('site-packages/', 'lib/python3.11/', '/work/'):
        if key in p: p = p.split(key, 1)[1]
    pkg = p.split('/')[0] if '/' in p else p
    by_file[pkg] += n; by_func[f'{fn} {p}'] += n
print('total', total)
for k, v in by_file.most_common(25): print(f'{100*v/total:5.1f}% {k}')
print()
for k, v in by_func.most_common(40): print(f'{100*v/total:5.1f}% {k}')
