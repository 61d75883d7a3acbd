import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
variants = sys.argv[2:]
t = {}
for r in rows:
    if r['status'] != 'ok': continue
    key = 'x'.join(r[k] for k in ('batch', 'heads', 'len_q', 'len_kv', 'head_dim', 'causal'))
    t[(key, r['stage'], r['pass'])] = float(r['median_ms'])
shapes = sorted({k[0] for k in t})
for sh in shapes:
    m = lambda st, p: t.get((sh, st, p))
    out = [sh.ljust(24)]
    for v in variants:
        parts = []
        for p in ('fwd', 'bwd', 'bwd_det'):
            a, b = m('11_main', p), m(v, p)
            parts.append(f"{p} {a/b:.3f}" if a and b else f"{p} -")
        out.append(f"{v}: main/it " + " ".join(parts))
    c = m('torch_cudnn', 'bwd')
    cu = [f"{st} {c/m(st,'bwd'):.3f}" for st in ['11_main'] + variants if c and m(st, 'bwd')]
    dd = [f"{st} {m(st,'bwd_det')/m(st,'bwd'):.3f}" for st in ['11_main'] + variants if m(st, 'bwd') and m(st, 'bwd_det')]
    print(' | '.join(out))
    print(' ' * 24 + 'cuDNN bwd over: ' + ', '.join(cu) + ' | det/default: ' + ', '.join(dd))
