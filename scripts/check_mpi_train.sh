#!/usr/bin/env bash
# Data-parallel training under MPI equals the single worker: the same run as one process and
# as 2 and 4 MPI ranks (ZeRO-0 and ZeRO-1); every step's loss must agree to 1e-5 relative.
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
run() {  # ranks layout dir
  timeout 300 mpirun -n "$1" --allow-run-as-root --oversubscribe "$bin" "${args[@]}" --backend mpi --layout "$2" --out "$tmp/$3" >/dev/null 2>"$tmp/$3.log" \
    || { echo "mpi: $2 failed:"; cat "$tmp/$3.log"; exit 1; } >&2
}
run 2 dp=2 two
run 4 dp=4,zero=1 four
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
losses = lambda n: json.load(open(f"{d}/{n}/trainer_state.json"))["losses"]
want = losses("one")
for n in ("two", "four"):
    got = losses(n)
    assert len(got) == len(want), (n, got, want)
    for s, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= 1e-5 * abs(w), f"{n}: step {s + 1} loss {g} vs single worker {w}"
print("mpi: dp=2 and dp=4,zero=1 under mpirun match the single worker's losses:", [round(x, 6) for x in want])
PY
