import csv, sys, statistics
rows = list(csv.DictReader(open(sys.argv[1])))
keys = []
for r in rows:
    k = (r['sharding'], int(r['len']), r['causal'])
    if k not in keys: keys.append(k)
print("# The ring's forward on stage 12's kernel (branch ring-forward-12 at 05e77c4, 'new') against the ring as on main")
print("# (6146d7b, stage 11's forward, 'old'), two H200s (call R1), alternating old/new in each round; ring-forward-12-h200/ab.csv.")
print("# ring: the ring call's median ms; old/new: old's time over new's (> 1: stage 12's forward faster); alone: the")
print("# baseline's time (the forward kernel alone at the tokens per GPU, on both GPUs at once), old over new.")
print("# Made by: python3 docs/profiles/13_ring_attention/ring-forward-12-h200/absum.py ab.csv.")
print(f"{'sharding':<11}{'tokens':>8} {'causal':>6}  {'round':>5} {'old ms':>9} {'new ms':>9} {'old/new':>8} {'alone old/new':>14}")
for k in keys:
    olds = [r for r in rows if (r['sharding'], int(r['len']), r['causal']) == k and r['build'] == 'old']
    news = [r for r in rows if (r['sharding'], int(r['len']), r['causal']) == k and r['build'] == 'new']
    for i, (o, n) in enumerate(zip(olds, news), 1):
        print(f"{k[0]:<11}{k[1]:>8} {k[2]:>6}  {i:>5} {float(o['median_ms']):>9.2f} {float(n['median_ms']):>9.2f} "
              f"{float(o['median_ms'])/float(n['median_ms']):>8.3f} {float(o['baseline_ms'])/float(n['baseline_ms']):>14.3f}")
