#!/usr/bin/env bash
# Real hosts: three hosts that reach each other only over TCP — network namespaces of this
# machine, each with its own address on a bridge (veth pairs made here, iproute2), mpirun
# started in the first and reaching the others through scripts/netns_rsh.sh, Open MPI's TCP
# transport between every pair of ranks (no shared memory). Checked across them:
#   1. dp=2 × tp=2 training on 2 hosts (2 ranks each) equals the single worker's losses (1e-5),
#      and megabytes crossed the second host's link;
#   2. `brigade embed` on 3 hosts writes one local worker's bytes;
#   3. `brigade launch --np 6 --hosts H1:2,H2:2,H3:2 --min-ranks 2` loses the third host
#      mid-run (its processes killed, its link down), resumes on the 4 ranks of the other two
#      under the planner's layout and ends with the uninterrupted run's weights (1e-5);
#   4. `brigade serve --backend mpi --tp 2` (started by `brigade launch --np 2 --hosts …`), and
#      `--pp 2`, with their ranks on two hosts give one process's tokens and log-probabilities
#      bit for bit; the --tp server's rank on host 2 killed, launch starts it again and it
#      answers the same;
#   5. `brigade route` on host 1 over replicas on hosts 2 and 3: host 3's replica killed under
#      load (and its link taken down), no request lost, every answer one replica's tokens.
# Needs root, iproute2, Open MPI, a build with --features mpi and ../shared/models.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin=$root/target/release/brigade
model=$(realpath ../shared/models/all-MiniLM-L6-v2)
command -v ip >/dev/null || { echo "hosts: needs iproute2 (ip)" >&2; exit 1; }
id=$$
pre=bh${id}n                 # namespaces bh<pid>n1..3 are the hosts
br=bb${id}                   # the switch
net=10.79.0.
export BRIGADE_NETNS_PREFIX=$pre
tmp=$(mktemp -d)
cleanup() {
  for i in 1 2 3; do
    ip netns pids "$pre$i" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$pre$i" 2>/dev/null || true
  done
  ip link del "$br" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
ip link add "$br" type bridge
ip link set "$br" up
for i in 1 2 3; do
  ip netns add "$pre$i"
  ip link add "bv${id}$i" type veth peer name eth0 netns "$pre$i"
  ip link set "bv${id}$i" master "$br" up
  ip netns exec "$pre$i" ip addr add "$net$i/24" dev eth0
  ip netns exec "$pre$i" ip link set eth0 up
  ip netns exec "$pre$i" ip link set lo up
done
# (rtc_hwloc_vmhole none: Open MPI 4.1's remote daemon maps its shared hwloc topology into a
# "hole" of its address space, which now and then lands beside its stack and segfaults it in
# hwloc_shmem_topology_write; without the shared copy each daemon reads its own topology)
mpiargs="--mca plm_rsh_agent $root/scripts/netns_rsh.sh --mca btl tcp,self --mca btl_tcp_if_include ${net}0/24 --mca oob_tcp_if_include ${net}0/24 --mca rtc_hwloc_vmhole none"
on1() { ip netns exec "${pre}1" "$@"; }
# shellcheck disable=SC2086
mpi() { on1 timeout 300 mpirun --allow-run-as-root --oversubscribe $mpiargs "$@"; }
# the hosts are apart: host 2 runs in its own namespace, with its own address
mpi -n 2 --host "${net}1:1,${net}2:1" sh -c 'ip -4 -o addr show eth0' >"$tmp/where" 2>&1
grep -q "${net}2/" "$tmp/where" || { echo "hosts: rank 1 did not run on host 2:"; cat "$tmp/where"; exit 1; } >&2
bytes() { echo $(( $(cat "/sys/class/net/bv${id}$1/statistics/rx_bytes") + $(cat "/sys/class/net/bv${id}$1/statistics/tx_bytes") )); }

# 1. dp × tp across two hosts equals one worker
args=(train --steps 5 --batch 8 --threads 1 --eval-every 0 --seed 7)
"$bin" "${args[@]}" --out "$tmp/one" >/dev/null 2>&1
before=$(bytes 2)
mpi -n 4 --host "${net}1:2,${net}2:2" "$bin" "${args[@]}" --backend mpi --layout dp=2,tp=2 --out "$tmp/dptp" >"$tmp/dptp.log" 2>&1 \
  || { echo "hosts: dp=2,tp=2 across two hosts failed:"; cat "$tmp/dptp.log"; exit 1; } >&2
crossed=$(( $(bytes 2) - before ))
[ "$crossed" -gt 1000000 ] || { echo "hosts: only $crossed bytes crossed host 2's link" >&2; exit 1; }

# 2. an embedding job across three hosts equals one worker, byte for byte
python3 - >"$tmp/corpus.txt" <<'PY'
words = "shard rank vector model resume kill token encoder parallel machine corpus naïve 東京 🙂".split()
for i in range(240):
    print(" ".join(words[(i * 31 + j * 17) % len(words)] for j in range(3 + (i * 7) % 38)))
PY
eargs=(embed --model "$model" --input "$tmp/corpus.txt" --shard-size 20 --max-batch-tokens 400)
"$bin" "${eargs[@]}" --output "$tmp/eref" --workers 1 --threads 2 >/dev/null 2>&1
mpi -n 3 --host "${net}1:1,${net}2:1,${net}3:1" "$bin" "${eargs[@]}" --backend mpi --output "$tmp/ehosts" >"$tmp/embed.log" 2>&1 \
  || { echo "hosts: embed across three hosts failed:"; cat "$tmp/embed.log"; exit 1; } >&2
diff -r "$tmp/eref" "$tmp/ehosts" >/dev/null || { echo "hosts: embed across three hosts wrote other bytes than one worker" >&2; exit 1; }

# 3. a host taken down mid-run: the supervisor finishes the job on the other two
largs=(train --steps 60 --batch 12 --layout dp=6 --threads 1 --save-every 4 --eval-every 0 --seed 3)
"$bin" "${largs[@]}" --out "$tmp/whole" >/dev/null 2>&1
on1 "$bin" launch --np 6 --hosts "${net}1:2,${net}2:2,${net}3:2" --min-ranks 2 --mpirun-args "$mpiargs" \
  -- "${largs[@]}" --out "$tmp/el" >"$tmp/el.log" 2>&1 &
sup=$!
step() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['step'])" "$tmp/el/trainer_state.json" 2>/dev/null || echo 0; }
for _ in $(seq 1200); do
  [ "$(step)" -ge 8 ] && break
  sleep 0.1
done
at=$(step)
ip netns pids "${pre}3" | xargs -r kill -9
ip netns exec "${pre}3" ip link set eth0 down
wait "$sup" || { echo "hosts: the supervised job did not finish after host 3 went down:"; cat "$tmp/el.log"; exit 1; } >&2
[ "$at" -ge 8 ] && [ "$at" -lt 60 ] || { echo "hosts: host 3 went down at step $at, not mid-run" >&2; exit 1; }
grep -q "resumed step [0-9]* on 4 ranks as" "$tmp/el.log" || { echo "hosts: the job did not resume on the 4 ranks left:"; cat "$tmp/el.log"; exit 1; } >&2
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
losses = lambda n: json.load(open(f"{d}/{n}/trainer_state.json"))["losses"]
for got, want, n in [(losses("dptp"), losses("one"), "dp=2,tp=2 on two hosts"), (losses("el"), losses("whole"), "the job that lost host 3")]:
    assert len(got) == len(want), (n, len(got), len(want))
    for s, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= 1e-5 * abs(w), f"{n}: step {s + 1} loss {g} vs {w}"
print("hosts: dp=2,tp=2 on two hosts and the job that lost host 3 match their references' losses to 1e-5")
PY
scripts/weights_close.py "$tmp/el" "$tmp/whole" --within 1e-5 --what "hosts: the job that lost host 3, against the uninterrupted run"

# 4. a model served with its tensor-parallel ranks on two hosts equals one process
"$bin" train --model llama-tiny --data "$root/README.md" --seq 64 --batch 8 --steps 150 --lr 3e-3 --threads 2 --eval-every 0 --no-sample --out "$tmp/llama" >/dev/null 2>&1
on1 "$bin" serve --checkpoint "$tmp/llama" --port 18101 --threads 2 >"$tmp/serve1.log" 2>&1 &
before=$(bytes 2)
# (not through on1: a shell function in the background is a subshell, and SIGTERM would end it
# instead of launch)
ip netns exec "${pre}1" timeout 300 "$bin" launch --np 2 --hosts "${net}1:1,${net}2:1" --mpirun-args "$mpiargs" -- \
  serve --tp 2 --checkpoint "$tmp/llama" --port 18102 --threads 1 >"$tmp/serve2.log" 2>&1 &
served=$!
# shellcheck disable=SC2086
on1 timeout 300 mpirun --allow-run-as-root --oversubscribe $mpiargs -n 2 --host "${net}1:1,${net}2:1" \
  "$bin" serve --backend mpi --pp 2 --checkpoint "$tmp/llama" --port 18103 --threads 1 >"$tmp/serve3.log" 2>&1 &
piped=$!
for port in 18101 18102 18103; do
  for _ in $(seq 1 300); do on1 curl -sf "127.0.0.1:$port/ready" >/dev/null && break; sleep 0.2; done
  on1 curl -sf "127.0.0.1:$port/ready" >/dev/null || { echo "hosts: the server on $port did not start:"; cat "$tmp"/serve*.log; exit 1; } >&2
done
same() {  # each server on the given ports answers as the one-process server on 18101
  on1 python3 - "$@" <<'PY'
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
prompts = ["The ring", "brigade trains", "Every layout", "A rank holds"]
def ask(port, p):
    body = json.dumps({"model": "llama", "prompt": p, "max_tokens": 16, "temperature": 0, "logprobs": 2}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"content-type": "application/json"})
    c = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]
    return c["text"], c["logprobs"]["token_logprobs"], c["logprobs"]["top_logprobs"]
what = {"18102": "--tp 2", "18103": "--pp 2"}
with ThreadPoolExecutor(4) as ex:
    want = list(ex.map(lambda p: ask(18101, p), prompts))
    for port in sys.argv[1:]:
        got = list(ex.map(lambda p: ask(int(port), p), prompts))
        for p, x, y in zip(prompts, want, got):
            assert x == y, f"{p!r}: one process {x} vs {what[port]} across two hosts {y}"
PY
}
same 18102 18103
served_bytes=$(( $(bytes 2) - before ))
kill -TERM "$piped" 2>/dev/null || true
wait "$piped" 2>/dev/null || true
# the --tp server's rank on host 2 killed (and its host's MPI daemon): launch starts it again
ip netns pids "${pre}2" | xargs -r kill -9
for _ in $(seq 1 300); do grep -q "restart 1 of" "$tmp/serve2.log" && on1 curl -sf 127.0.0.1:18102/ready >/dev/null && break; sleep 0.2; done
grep -q "restart 1 of" "$tmp/serve2.log" || { echo "hosts: launch did not restart the server:"; cat "$tmp/serve2.log"; exit 1; } >&2
same 18102
kill -TERM "$served" 2>/dev/null || true
wait "$served" || { echo "hosts: launch did not stop cleanly (exit status $?):"; cat "$tmp/serve2.log"; exit 1; } >&2

# 5. a router on host 1 over replicas on hosts 2 and 3; host 3 lost under load
ip netns exec "${pre}3" ip link set eth0 up
ip netns exec "${pre}2" "$bin" serve --checkpoint "$tmp/llama" --host "${net}2" --port 18111 --threads 1 >"$tmp/rep2.log" 2>&1 &
ip netns exec "${pre}3" "$bin" serve --checkpoint "$tmp/llama" --host "${net}3" --port 18111 --threads 1 >"$tmp/rep3.log" 2>&1 &
for h in 2 3; do
  for _ in $(seq 1 300); do on1 curl -sf "${net}$h:18111/ready" >/dev/null && break; sleep 0.2; done
done
on1 "$bin" route --replica "http://${net}2:18111" --replica "http://${net}3:18111" --policy least-loaded --port 18110 >"$tmp/route.log" 2>&1 &
for _ in $(seq 1 100); do on1 curl -sf 127.0.0.1:18110/ready >/dev/null && break; sleep 0.1; done
on1 python3 - "${pre}3" <<'PY'
import json, subprocess, sys, threading, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
prompts = ["The ring", "brigade trains", "Every layout", "A rank holds", "keys and values", "The planner"]
def ask(url, p):
    body = json.dumps({"model": "llama", "prompt": p, "max_tokens": 48, "temperature": 0, "logprobs": 1}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
    c = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]
    return c["text"], c["logprobs"]["token_logprobs"]
want = {p: ask("http://127.0.0.1:18101", p) for p in prompts}  # the one-process server of check 4
def kill_host3():
    # as soon as host 3 has requests in flight
    key = 'brigade_route_replica_in_flight{replica="http://10.79.0.3:18111"}'
    for _ in range(5000):
        m = urllib.request.urlopen("http://127.0.0.1:18110/metrics").read().decode()
        if any(l.startswith(key) and float(l.split()[-1]) >= 1 for l in m.splitlines()):
            break
        time.sleep(0.001)
    # (run from host 1's namespace: the host's processes are found through ip netns)
    subprocess.run(f"ip netns pids {sys.argv[1]} | xargs -r kill -9", shell=True)
    subprocess.run(["ip", "netns", "exec", sys.argv[1], "ip", "link", "set", "eth0", "down"])
threading.Thread(target=kill_host3).start()
with ThreadPoolExecutor(12) as ex:
    got = list(ex.map(lambda i: ask("http://127.0.0.1:18110", prompts[i % len(prompts)]), range(150)))
for i, g in enumerate(got):
    assert g == want[prompts[i % len(prompts)]], f"request {i} through the router: {g} vs {want[prompts[i % len(prompts)]]}"
m = urllib.request.urlopen("http://127.0.0.1:18110/metrics").read().decode()
retried = float([l for l in m.splitlines() if l.startswith("brigade_route_retries_total")][0].split()[-1])
assert retried >= 1, f"host 3 went down with nothing in flight: the check did not test a loss\n{m}"
print(f"hosts: 150 requests through the router, host 3 lost under load: none lost, every one a single replica's tokens ({retried:.0f} retried)")
PY
echo "hosts: dp=2,tp=2 across 2 hosts equals one worker ($crossed bytes over host 2's link); embed across 3 hosts byte-identical; host 3 lost at step $at: $(grep -o 'resumed step [0-9]* on [0-9]* ranks as [^ ]*' "$tmp/el.log"); serve --tp 2 and --pp 2 across 2 hosts give one process's tokens and log-probabilities ($served_bytes bytes over host 2's link), the --tp server restarted by launch after its host-2 rank was killed"
