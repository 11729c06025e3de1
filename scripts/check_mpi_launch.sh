#!/usr/bin/env bash
# `brigade launch --np 4` under mpirun (one rank a process, dp=2 × tp=2): a rank killed with
# SIGKILL mid-forward, mid-backward, inside the gradient all-reduce, during a background save
# and right after a save's rename, or panicking, or hanging (caught by --hang-timeout), and the supervised job finishes with final
# weights and AdamW moments bit-identical to an uninterrupted run of the same layout, having
# redone at most two saves' worth of steps (at most one save is in flight when a rank dies);
# with --min-ranks 2 a death resumes on 3 ranks — no layout of 3 trains the batch of 8, so 2 —
# and ends within the equivalence tolerance (1e-5) of the uninterrupted run.
# Needs Open MPI and a build with --features mpi.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release/brigade
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
every=2
args=(train --steps 8 --batch 8 --layout dp=2,tp=2 --threads 1 --save-every "$every" --eval-every 0 --seed 5)
timeout 300 mpirun -n 4 --allow-run-as-root --oversubscribe "$bin" "${args[@]}" --backend mpi --out "$tmp/whole" >"$tmp/whole.log" 2>&1 \
  || { echo "mpi launch: the uninterrupted run failed:"; cat "$tmp/whole.log"; exit 1; } >&2
sup() {  # name fault [launch flags]
  BRIGADE_FAULT=$2 BRIGADE_FAULT_ONCE="$tmp/$1.fired" timeout 600 "$bin" launch --np 4 --mpirun-args "-x BRIGADE_FAULT -x BRIGADE_FAULT_ONCE" "${@:3}" \
    -- "${args[@]}" --out "$tmp/$1" >"$tmp/$1.log" 2>&1 || { echo "mpi launch: $2: the supervised job failed:"; cat "$tmp/$1.log"; exit 1; } >&2
  grep -q "restart 1 of" "$tmp/$1.log" || { echo "mpi launch: $2: no restart:"; cat "$tmp/$1.log"; exit 1; } >&2
  redo=$(grep -o '[0-9]* finished step(s) to redo' "$tmp/$1.log" | grep -o '^[0-9]*' || echo 0)
  [ "$redo" -le $((2 * every)) ] || { echo "mpi launch: $2: $redo steps redone" >&2; exit 1; }
}
n=0
for fault in forward:3:1:kill backward:5:2:kill reduce:4:3:kill writing:4:0:kill renamed:6:0:kill backward:3:1:panic; do
  n=$((n + 1))
  sup "run$n" "$fault"
  for f in model optimizer; do
    cmp -s "$tmp/run$n/$f.safetensors" "$tmp/whole/$f.safetensors" || { echo "mpi launch: $fault: $f.safetensors differs from the uninterrupted run's" >&2; exit 1; }
  done
done
# a rank stuck outside any collective: the supervisor's --hang-timeout kills mpirun's job
sup hung backward:5:2:hang --hang-timeout 5
grep -q "the job hung" "$tmp/hung.log" || { echo "mpi launch: the hang was not named:"; cat "$tmp/hung.log"; exit 1; } >&2
cmp -s "$tmp/hung/model.safetensors" "$tmp/whole/model.safetensors" || { echo "mpi launch: after a hang the weights differ" >&2; exit 1; }
sup elastic backward:5:1:kill --min-ranks 2
grep -q "resumed step [0-9]* on 2 ranks as" "$tmp/elastic.log" || { echo "mpi launch: no elastic resume on 2 ranks:"; cat "$tmp/elastic.log"; exit 1; } >&2
scripts/weights_close.py "$tmp/elastic" "$tmp/whole" --within 1e-5 --what "mpi launch: resumed on fewer ranks, against the uninterrupted run"
echo "mpi launch: killed at forward, backward, all-reduce, a half-written save and a renamed one, panicking or hung: bit-identical after the restart; $(grep -o 'resumed step [0-9]* on [0-9]* ranks as [^ ]*' "$tmp/elastic.log")"
