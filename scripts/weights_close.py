#!/usr/bin/env python3
"""Whether two brigade checkpoints hold the same model to a tolerance: the relative L2
distance of every f32 tensor of GOT/model.safetensors to WANT's, by name. Prints it; exits 1
when the tensors differ in name or size, or the distance is not below --within.

Usage: scripts/weights_close.py GOT WANT [--within 1e-5] [--what LABEL]
"""
import argparse
import json
import struct
import sys


def weights(d):
    b = open(f"{d}/model.safetensors", "rb").read()
    k = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + k])
    out = {}
    for name in sorted(x for x in h if x != "__metadata__"):
        assert h[name]["dtype"] == "F32", (d, name, h[name]["dtype"])
        s, e = h[name]["data_offsets"]
        out[name] = struct.unpack(f"<{(e - s) // 4}f", b[8 + k + s:8 + k + e])
    return out


p = argparse.ArgumentParser()
p.add_argument("got")
p.add_argument("want")
p.add_argument("--within", type=float, default=1e-5)
p.add_argument("--what", default="the model")
a = p.parse_args()
g, w = weights(a.got), weights(a.want)
if g.keys() != w.keys() or any(len(g[n]) != len(w[n]) for n in w):
    sys.exit(f"{a.what}: the checkpoints hold other tensors")
num = sum((x - y) ** 2 for n in w for x, y in zip(g[n], w[n]))
den = sum(y * y for n in w for y in w[n])
rel = (num / den) ** 0.5
if not rel < a.within:
    sys.exit(f"{a.what}: the weights differ by {rel:.2e} (relative L2), not below {a.within:g}")
print(f"{a.what}: weights within {rel:.1e} (relative L2)")
