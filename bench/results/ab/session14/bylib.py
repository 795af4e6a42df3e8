import sys, collections, re
c=collections.Counter(); tot=0
for line in open(sys.argv[1]):
    line=line.rstrip()
    if not line: continue
    stack,_,n=line.rpartition(' '); n=int(n); tot+=n
    frs=stack.split(';')
    # attribute to the innermost frame that names a file
    key='?'
    for f in reversed(frs):
        m=re.search(r'\((.*?):\d+\)$', f)
        if not m:
            m2=re.search(r'\(([^()]*\.so[^()]*)\)$', f)
            if m2 and 'libpython' not in m2.group(1): key=m2.group(1).split('/')[-1]; break
            continue
        p=m.group(1)
        if '/work/main/' in p and 'site-packages' not in p: key='OURS '+p.split('/work/main/')[1].split('/')[0]
        elif 'site-packages' in p: key='lib '+p.split('site-packages/')[1].split('/')[0]
        elif '.pyx' in p or '.c' in p or '.h' in p: key='c '+p.split('/')[-1]
        else: key='stdlib '+p.split('/')[-1]
        break
    c[key]+=n
for k,v in c.most_common(40): print(f'{100*v/tot:5.1f}% {k}')
