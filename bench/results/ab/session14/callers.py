import sys, collections, re
# callers.py RAW LEAF [depth]: for stacks whose leaf starts with LEAF, the nearest .py/.pyx frames
leaf=sys.argv[1+1]; depth=int(sys.argv[3]) if len(sys.argv)>3 else 2
c=collections.Counter(); tot=0; all_=0
for line in open(sys.argv[1]):
    line=line.rstrip()
    if not line: continue
    stack,_,n=line.rpartition(' '); n=int(n); all_+=n
    frs=stack.split(';')
    if not frs[-1].startswith(leaf): continue
    tot+=n
    py=[f for f in frs if '.py' in f and 'libpython' not in f]
    key=' <- '.join(re.sub(r'\(.*/','(',f) for f in py[-depth:][::-1])
    c[key]+=n
print(f'{leaf}: {tot} of {all_} ({100*tot/all_:.1f}%)')
for k,v in c.most_common(15): print(f'{100*v/all_:5.1f}% {k}')
