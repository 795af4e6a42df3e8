import sys, collections, re
c = collections.Counter(); total = 0
for line in open(sys.argv[1]):
    line = line.rstrip()
    if not line: continue
    stack, _, n = line.rpartition(' ')
    n = int(n); total += n
    fr = stack.split(';')[-1]
    m = re.match(r'(.*) \((.*?):(\d+)\)$', fr)
    key = f'{m.group(1)} {m.group(2).split("/")[-1]}:{m.group(3)}' if m else fr
    c[key] += n
print('total', total)
for k, v in c.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 40): print(f'{100*v/total:5.1f}% {k}')
