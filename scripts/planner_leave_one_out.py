"""Leave-one-out check of the planner's formulas (a Python prototype of crates/brigade/src/plan/cost.rs,
without the memory filter): for each published run, refit the five efficiency constants on the
other rows by grid search and predict the held-out one. Quoted in docs/planner.md ("mean error 6.5%,
worst 17%"). Stdlib only; run from the repository root:  python3 scripts/planner_leave_one_out.py
"""
import csv, math, itertools
rows = list(csv.DictReader(open('../shared/anchors/published_runs.tsv'), delimiter='\t'))
GPU = {'A100': dict(peak=312e12, hbm=2.0e12, nvl=300e9, net=25e9, mem=80), 'H100': dict(peak=989e12, hbm=3.35e12, nvl=450e9, net=50e9, mem=80)}

def predict(r, C, mb, v, rec):
    L,h,a = int(r['layers']), int(r['hidden']), int(r['heads'])
    kv = int(r['kv_heads'] or a); ffn = int(r['ffn_hidden'] or 4*h); s=int(r['seq_len']); V=int(r['vocab'])
    N=int(r['gpus']); tp,pp,dp=int(r['tp']),int(r['pp']),int(r['dp']); B=int(r['global_batch_seqs'])
    swiglu = 'Llama' in r['model']
    g = GPU['H100' if 'H100' in r['gpu_type'] else 'A100']
    hkv = h*kv//a
    f_lin = 2*h*(h+2*hkv) + 2*h*h + 2*h*ffn*(3 if swiglu else 2)
    f_att = 4*s*h
    f_head = 2*h*V
    m = B//(dp*mb)
    tok = mb*s
    x = h/tp
    eg = C['emax'][g is GPU['H100']] * x/(x+C['x0'])
    ea = C['eatt'][g is GPU['H100']]
    # per layer per microbatch forward time on one GPU
    t_lin = tok*f_lin/tp/(g['peak']*eg)
    t_att = tok*f_att/tp/(g['peak']*ea)
    sp = tp>1
    elem = (7*h+4*hkv + (3*h+6*ffn if swiglu else 3*h+4*ffn) + 4*h)  # activation bytes per token per layer (16-bit)
    t_mem = C['cmem']*tok*elem/(tp if sp else 1)/g['hbm']
    t_f = t_lin + t_att + t_mem
    t_b = 2*t_f
    t_r = {'full': t_f, 'selective': t_att, 'none': 0}[rec]
    nar = {'full': 6, 'selective': 4, 'none': 4}[rec]
    size = tok*h*2
    bw_tp = g['nvl'] if tp <= 8 else g['net']
    t_tp = nar*(C['alpha'] + 2*(tp-1)/tp*size/bw_tp) if tp>1 else 0
    lps = math.ceil(L/(pp*v))*v
    t_head = 3*tok*f_head/tp/(g['peak']*eg)
    t_stage = lps*(t_f+t_b+t_r+t_tp) + t_head
    t_pipe = (m + (pp-1)/v)*t_stage
    # p2p
    bw_pp = g['net'] if tp*pp > 8 or tp == 8 else g['nvl']
    t_p2p = (2*v*m*(C['alpha'] + size/(tp if sp else 1)/bw_pp)) if pp>1 else 0
    # dp grads
    P = L*(f_lin/2) + V*h  # params approx (f_lin/2 = weights per token-flop/2)
    Pg = P/(tp*pp)
    bw_dp = g['net'] if N > 8 else g['nvl']
    t_dp = 2*(dp-1)/dp*Pg*2/bw_dp if dp>1 else 0
    t_dp_exp = max(0, t_dp - C['ovl']*lps*t_b)
    t_opt = 16*Pg/g['hbm']*C['copt']
    T = t_pipe + t_p2p + t_dp_exp + t_opt
    Fm = 3*B*s*(L*(f_lin+f_att)+f_head)
    extra = {'full': L*(f_lin+f_att), 'selective': L*f_att, 'none':0}[rec]
    Fhw = Fm + B*s*extra
    return T, Fm/(N*T)/1e12, Fhw/(N*T)/1e12

def run(C, show=False):
    errs=[]
    for r in rows:
        rec = r['recompute'].split(' ')[0] if r['recompute'] else None
        mbs = [int(r['microbatch'])] if r['microbatch'] else [1,2,4]
        vs = [int(r['interleave'])] if r['interleave'] else [1,2,4,8]
        recs = [rec] if rec else ['none','selective','full']
        best = None
        for mb in mbs:
            if int(r['global_batch_seqs']) % (int(r['dp'])*mb): continue
            for v in vs:
                for rc in recs:
                    T, mt, ht = predict(r, C, mb, v, rc)
                    if best is None or T < best[0]: best = (T, mt, ht, mb, v, rc)
        T, mt, ht, mb, v, rc = best
        pub = float(r['tflops_per_gpu'])
        pred = ht if r['tflops_kind'].startswith('hardware') else mt
        e = pred/pub - 1
        errs.append(e)
        if show: print(f"{r['id']:15} pub {pub:6.1f} pred {pred:6.1f} err {e*100:+5.1f}%  (mb={mb} v={v} rec={rc})")
    return errs


base = dict(emax=(0.0,0.0), x0=0, eatt=(0.5,0.4), cmem=2, alpha=20e-6, ovl=1.0, copt=1.0)
grid = [dict(base, emax=(a1,h1), x0=x0, eatt=att, cmem=cm)
        for a1 in [0.6,0.65,0.7,0.75,0.8] for h1 in [0.7,0.75,0.8,0.85,0.9] for x0 in [128,256,384]
        for att in [(0.4,0.3),(0.5,0.4),(0.6,0.5),(0.7,0.6)] for cm in [4,6,8,10]]
allerrs = [run(C) for C in grid]
n = len(rows)
loo = []
for i in range(n):
    best = min(range(len(grid)), key=lambda g: max(abs(e) for j,e in enumerate(allerrs[g]) if j != i))
    loo.append(allerrs[best][i])
    print(f"{rows[i]['id']:15} held-out error {allerrs[best][i]*100:+.1f}%")
print("worst held-out", max(abs(e) for e in loo)*100, "mean abs", sum(abs(e) for e in loo)/n*100)
