"""Makes crates/brigade/tests/fixtures/lr_schedule.json: the learning rate at every step of
torchtitan's warmup + cosine schedule (`LRSchedulersContainer.Config(decay_type="cosine")`,
torchtitan 0.3.0 from PyPI, driving a real `torch.optim.AdamW`), for runs of several lengths,
warmups (none, one step, all steps, the 5% default) and floors.

brigade's `LrSchedule` follows torchtitan's rule: linear warmup counted from 1 (step 0 already
trains), the peak held one more step, then cosine toward `min_lr`, which is reached one step past
the last (torchtitan's "virtual last step", so that a floor of 0 never wastes the last step).
The test `lr_schedule_matches_torchtitan` (tests/adamw_fixture.rs) reads this file.

Run from the repository root in the peers' environment (../shared/peers/setup_venv.sh) with
torchtitan added (its other dependencies are not needed for the scheduler):
    .venv/bin/pip install --no-deps torchtitan==0.3.0 tyro spmd_types
    .venv/bin/python scripts/make_lr_schedule_fixture.py
"""
import json

import torch
from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer

OUT = "crates/brigade/tests/fixtures/lr_schedule.json"
# (steps, warmup, lr, min_lr); warmup None: brigade's default, 5% of the steps (rounded down)
CASES = [
    (6, 2, 1e-2, 1e-3),
    (10, 0, 3e-4, 3e-5),
    (10, 1, 3e-4, 0.0),
    (5, 5, 1e-3, 1e-4),
    (7, 6, 1e-3, 1e-4),
    (20, 3, 6e-4, 6e-5),
    (1, 0, 1e-3, 1e-4),
    (1, 1, 1e-3, 1e-4),
    (100, None, 3e-4, None),
    (19, None, 3e-4, None),
    (41, None, 1e-3, 2e-4),
]

cases = []
for steps, warmup, lr, min_lr in CASES:
    w = steps // 20 if warmup is None else warmup
    floor = lr / 10 if min_lr is None else min_lr
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = LRSchedulersContainer.Config(
        warmup_steps=w, decay_type="cosine", min_lr_factor=floor / lr
    ).build(optimizers=[opt], training_steps=steps)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])  # the rate this step trains at
        opt.step()
        sched.step()
    cases.append(dict(steps=steps, warmup=warmup, lr=lr, min_lr=min_lr, lrs=lrs))
    print(steps, warmup, ["%.6g" % x for x in lrs[:8]], "…" if steps > 8 else "")
with open(OUT, "w") as f:
    json.dump(dict(source="torchtitan 0.3.0 LRSchedulersContainer, decay_type=cosine", cases=cases), f, indent=1)
print("wrote", OUT)
