#!/usr/bin/env bash
# Parallel training under MPI equals the single worker: the same run as one process and as 2,
# 4 and 8 MPI ranks (dp=2; dp=4 with ZeRO-3; dp=2 × tp=2 with ZeRO-1 and sequence parallelism,
# resumed by tp=4; the 3D mesh dp=2 × pp=2 × tp=2 with 1F1B; dp=2 × pp=4 with ZB-H1, resumed
# by pp=2 × tp=2), and the Llama family (llama-tiny) on the 3D mesh dp=2 × pp=2 × tp=2 with
# interleaved chunks; context parallelism dp=2 × cp=2 as 4 processes (GPT-2, all-gather) and
# cp=2 × tp=2 on a ring (llama-tiny); a mixture of experts (moe-tiny) with dp=4, ep=2 and with
# dp=2, cp=2, ep=2 as 4 processes; every step's loss must agree to 1e-5 relative.
# Needs a build with --features mpi (`cargo build --release -p brigade-cli --features mpi`).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release/brigade
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(train --steps 5 --batch 8 --threads 1 --eval-every 0 --seed 7)
"$bin" "${args[@]}" --out "$tmp/one" >/dev/null 2>&1
# outside mpirun, --backend mpi is refused with one line
if "$bin" "${args[@]}" --backend mpi >/dev/null 2>"$tmp/err"; then
  echo "mpi: --backend mpi outside mpirun was accepted" >&2; exit 1
fi
grep -q "mpirun" "$tmp/err" || { echo "mpi: unclear error outside mpirun: $(cat "$tmp/err")" >&2; exit 1; }
# a world that disagrees with the layout, and an impossible layout: one line, exit 1, no hang
for bad in "2:dp=4:needs 4 ranks but 2 were started" "3:tp=3:tp=3 does not divide"; do
  n=${bad%%:*}; bad=${bad#*:}
  if timeout 60 mpirun -n "$n" --allow-run-as-root --oversubscribe "$bin" "${args[@]}" --backend mpi --layout "${bad%%:*}" >/dev/null 2>"$tmp/err"; then
    echo "mpi: --layout ${bad%%:*} on $n ranks was accepted" >&2; exit 1
  fi
  grep -q "${bad#*:}" "$tmp/err" || { echo "mpi: unclear error for --layout ${bad%%:*}: $(cat "$tmp/err")" >&2; exit 1; }
done
run() {  # ranks layout dir [extra args]
  timeout 300 mpirun -n "$1" --allow-run-as-root --oversubscribe "$bin" "${args[@]}" --backend mpi --layout "$2" --out "$tmp/$3" "${@:4}" >/dev/null 2>"$tmp/$3.log" \
    || { echo "mpi: $2 failed:"; cat "$tmp/$3.log"; exit 1; } >&2
}
run 2 dp=2 two
run 4 dp=4,zero=3 four
run 8 dp=2,pp=2,tp=2,zero=1,schedule=1f1b cube --micro-batch 1
# the Llama family: grouped-query attention on 2 key/value heads, rotary positions, SwiGLU
"$bin" "${args[@]}" --model llama-tiny --out "$tmp/llama-one" >/dev/null 2>&1
run 8 dp=2,pp=2,tp=2,v=2,schedule=interleaved llama-cube --model llama-tiny --micro-batch 1
# context parallelism: each sequence split over 2 processes, keys and values exchanged by MPI
run 4 dp=2,cp=2 context
run 4 cp=2,tp=2,cp_comm=ring llama-ring --model llama-tiny
# a mixture of experts spread over 2 of 4 processes: tokens sent to their experts by MPI_Alltoallv
"$bin" "${args[@]}" --model moe-tiny --out "$tmp/moe-one" >/dev/null 2>&1
run 4 dp=4,ep=2 moe-ep --model moe-tiny
# and along its sequences: the routers' per-sequence statistics summed over the context group
run 4 dp=2,cp=2,ep=2 moe-cp --model moe-tiny
timeout 300 mpirun -n 8 --allow-run-as-root --oversubscribe "$bin" "${args[@]}" --stop-after 2 --backend mpi --layout dp=2,pp=4,schedule=zb --micro-batch 1 --out "$tmp/zb" >/dev/null 2>"$tmp/zb.log" \
  || { echo "mpi: dp=2,pp=4,schedule=zb failed:"; cat "$tmp/zb.log"; exit 1; } >&2
timeout 300 mpirun -n 4 --allow-run-as-root --oversubscribe "$bin" train --resume "$tmp/zb" --threads 1 --backend mpi --layout pp=2,tp=2 >/dev/null 2>"$tmp/zb2.log" \
  || { echo "mpi: resuming under pp=2,tp=2 failed:"; cat "$tmp/zb2.log"; exit 1; } >&2
# three steps under dp × tp, then the rest resumed by another layout
timeout 300 mpirun -n 4 --allow-run-as-root --oversubscribe "$bin" "${args[@]}" --stop-after 3 --backend mpi --layout dp=2,tp=2,zero=1,sp=1 --out "$tmp/mixed" >/dev/null 2>"$tmp/mixed.log" \
  || { echo "mpi: dp=2,tp=2,zero=1,sp=1 failed:"; cat "$tmp/mixed.log"; exit 1; } >&2
timeout 300 mpirun -n 4 --allow-run-as-root --oversubscribe "$bin" train --resume "$tmp/mixed" --threads 1 --backend mpi --layout tp=4 >/dev/null 2>"$tmp/mixed2.log" \
  || { echo "mpi: resuming under tp=4 failed:"; cat "$tmp/mixed2.log"; exit 1; } >&2
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
losses = lambda n: json.load(open(f"{d}/{n}/trainer_state.json"))["losses"]
want = losses("one")
for n, one in [("two", "one"), ("four", "one"), ("mixed", "one"), ("cube", "one"), ("zb", "one"), ("llama-cube", "llama-one"), ("context", "one"), ("llama-ring", "llama-one"), ("moe-ep", "moe-one"), ("moe-cp", "moe-one")]:
    got, want1 = losses(n), losses(one)
    assert len(got) == len(want1), (n, got, want1)
    for s, (g, w) in enumerate(zip(got, want1)):
        assert abs(g - w) <= 1e-5 * abs(w), f"{n}: step {s + 1} loss {g} vs single worker {w}"
print("mpi: moe-tiny with experts over ep=2 of dp=4, and of dp=2,cp=2 (4 processes each) matches the single worker's losses:", [round(x, 6) for x in losses("moe-one")])
print("mpi: context parallelism dp=2,cp=2 (4 processes) and llama-tiny cp=2,tp=2,cp_comm=ring match the single worker's losses")
print("mpi: llama-tiny on dp=2,pp=2,tp=2,v=2 (interleaved) matches the single worker's losses:", [round(x, 6) for x in losses("llama-one")])
print("mpi: dp=2, dp=4,zero=3, dp=2,tp=2,zero=1,sp=1 (resumed at step 3 by tp=4), dp=2,pp=2,tp=2 (1F1B) and dp=2,pp=4 (ZB-H1, resumed at step 2 by pp=2,tp=2) under mpirun match the single worker's losses:", [round(x, 6) for x in want])
PY
