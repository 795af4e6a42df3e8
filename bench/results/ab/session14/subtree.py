import sys, collections, re
# usage: subtree.py RAW FUNCNAME [N]: inclusive share of callees under frames matching FUNCNAME
target=sys.argv[2]; c=collections.Counter(); tot=0; all_=0
for line in open(sys.argv[1]):
    line=line.rstrip()
    if not line: continue
    stack,_,n=line.rpartition(' '); n=int(n); all_+=n
    frs=stack.split(';')
    idx=[i for i,f in enumerate(frs) if f.startswith(target+' ')]
    if not idx: continue
    tot+=n
    sub=frs[idx[0]+1:]
    seen=set()
    if not sub: c['<self>']+=n
    for f in sub[:3]:
        m=re.match(r'(.*) \((.*?):(\d+)\)$', f)
        k=f'{m.group(1)} {m.group(2).split("/")[-1]}:{m.group(3)}' if m else f
        if k not in seen: seen.add(k); c[k]+=n
print(f'{target}: {tot} of {all_} samples ({100*tot/all_:.1f}%)')
for k,v in c.most_common(int(sys.argv[3]) if len(sys.argv)>3 else 25): print(f'{100*v/all_:5.1f}% {k}')
