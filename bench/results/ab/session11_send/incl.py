import sys, collections, re
inc = collections.Counter(); total = 0
for line in open(sys.argv[1]):
    line = line.rstrip()
    if not line: continue
    stack, _, n = line.rpartition(' ')
    n = int(n); total += n
    seen = set()
    for fr in stack.split(';'):
        m = re.match(r'(.*) \((.*?):\d+\)$', fr)
        key = f'{m.group(1)} {m.group(2).split("/")[-1]}' if m else fr
        if key not in seen:
            seen.add(key); inc[key] += n
print('total', total)
for k, v in inc.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 60): print(f'{100*v/total:5.1f}% {k}')
