import sys, collections, re
# native raw: samples whose deepest *Python* frame is Runner.run; group by first C frame after loop internals and by leaf
pyre=re.compile(r'.* \((.*?\.py):\d+\)$')
c=collections.Counter(); leafs=collections.Counter(); tot=0; alln=0
for line in open(sys.argv[1]):
    line=line.rstrip()
    if not line: continue
    stack,_,n=line.rpartition(' '); n=int(n); alln+=n
    frs=stack.split(';')
    pys=[i for i,f in enumerate(frs) if pyre.match(f) and not f.startswith('<module>')]
    lastpy=frs[pys[-1]] if pys else ''
    if not lastpy.startswith('Runner.run'): continue
    tot+=n
    below=frs[pys[-1]+1:]
    # interesting frames: drop generic loop frames
    sig=[f.split(' (')[0] for f in below if not re.match(r'(uv_run|run_forever|run_until_complete|Loop__|Handle__run|loop_cb|uv__|Py_|_Py|__Pyx|0x)', f.split(' (')[0])]
    c[' > '.join(sig[:3])]+=n
    leafs[below[-1].split(' (')[0] if below else '?']+=n
print('Runner.run-deepest samples', tot, 'of', alln)
for k,v in c.most_common(30): print(f'{100*v/alln:5.1f}% {k}')
print('--- leaves')
for k,v in leafs.most_common(15): print(f'{100*v/alln:5.1f}% {k}')
