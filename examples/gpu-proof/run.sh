#!/usr/bin/env bash
# GPU proof: on a machine with a real NVIDIA GPU, a real CUDA process holds memory on GPU 0 and
#   reconciler --root examples/gpu-proof/root status --json   must show it on slot dark-compute-a with its memory,
#   reconciler --root examples/gpu-proof/root plan            must be blocked (exit 3), naming its pid,
# the same must hold with the slot named by its UUID, and once the process ends the plan must want to enter.
# Then the free-VRAM reserve: a real CUDA process takes all of GPU 0's memory but LEAVE_FREE_MIB (1024), so the card
# is below the 3 GiB reserve of root/configs/host.yaml; `status` (text and JSON) must say so, and the check an enter
# makes once its lane is healthy (Applier.check_reserve, via reserve_check.py: no Docker here, so no real enter)
# must fail it under policy enforce and let it stay under report. Each NVML answer read is kept (nvml-*.json, and
# copied to $OUT when that is set) as test data. Last, a process that opens GPU 0's device node and makes no CUDA
# context (NVML lists no such process): the plan must be blocked naming its pid, from the /proc scan's read of
# which processes hold a card's node open (safety rule 11).
#
# Needs: an NVIDIA driver, nvidia-ml-py, PyTorch with CUDA, and this package importable (installed, or run from
# the repository: the script puts the repository on PYTHONPATH). Exits 0 only when every check holds.
#
# Docker: status and plan also ask a Docker engine. Where this proof ran (a GPU machine without Docker) there is
# none, so the script starts stand_in_engine.py: NOT Docker, a stand-in answering only GET /_ping, /version and
# /containers/json (an empty list) on the unix socket that root/configs/host.yaml names. On a host with a real
# engine, point docker.url at it instead and skip the stand-in with STAND_IN_ENGINE=0.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
root=$here/root
work=/tmp/reconciler-gpu-proof        # docker.url in root/configs/host.yaml points here
hold_mib=${HOLD_MIB:-2048}
py=${PYTHON:-python3}
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if command -v reconciler >/dev/null 2>&1; then rec=(reconciler); else rec=("$py" -m reconciler); fi

mkdir -p "$work"
rm -f "$work/hold.in" "$work/hold.out"
engine_pid=""
holder_pid=""
cleanup() {
    exec 4>&- 2>/dev/null || true                      # closing the holder's stdin ends it
    [[ -n "$holder_pid" ]] && wait "$holder_pid" 2>/dev/null || true
    [[ -n "$engine_pid" ]] && kill "$engine_pid" 2>/dev/null || true
}
trap cleanup EXIT

show() {  # print a command as typed, then run it; its exit code lands in $rc
    echo
    echo "\$ $*"
    rc=0
    "$@" || rc=$?
    echo "[exit $rc]"
}

show_to() {  # like show, and keep its stdout in the file named first
    local out=$1
    shift
    echo
    echo "\$ $*"
    rc=0
    "$@" >"$out" || rc=$?
    cat "$out"
    echo "[exit $rc]"
}

echo "== the machine"
show nvidia-smi --query-gpu=index,name,uuid,memory.used,memory.total --format=csv
show "$py" -c 'import importlib.metadata as m, torch; print("nvidia-ml-py", m.version("nvidia-ml-py"), "| torch", torch.__version__, "| cuda", torch.cuda.is_available())'

if [[ "${STAND_IN_ENGINE:-1}" == 1 ]]; then
    echo
    echo "== a stand-in for Docker (this machine has no Docker engine): answers /_ping, /version, /containers/json=[]"
    "$py" "$here/stand_in_engine.py" "$work/engine.sock" 2>"$work/engine.log" &
    engine_pid=$!
    for _ in $(seq 50); do [[ -S "$work/engine.sock" ]] && break; sleep 0.1; done
    [[ -S "$work/engine.sock" ]] || { echo "stand-in engine did not start: $(cat "$work/engine.log")"; exit 1; }
    echo "stand-in engine pid $engine_pid on unix://$work/engine.sock"
fi

capture() {  # read_nvml's answer, as the parse gets it, into $work/$1
    "$py" - "$root" >"$work/$1" <<'PY'
import json, sys
from reconciler.load.host_file import load_host
from reconciler.observe.gpu import read_nvml
print(json.dumps(read_nvml(load_host(sys.argv[1])), indent=1))
PY
    echo "NVML answer kept in $work/$1"
}
capture nvml-idle.json

echo
echo "== a real CUDA process takes ${hold_mib} MiB on GPU 0 (not started by the reconciler, not in a container)"
mkfifo "$work/hold.in"
"$py" "$here/hold_gpu.py" --index 0 --mib "$hold_mib" --seconds 600 <"$work/hold.in" >"$work/hold.out" &
holder_pid=$!
exec 4>"$work/hold.in"
for _ in $(seq 600); do [[ -s "$work/hold.out" ]] && break; sleep 0.2; done
cat "$work/hold.out"
[[ -s "$work/hold.out" ]] || { echo "the CUDA holder did not take GPU memory"; exit 1; }
for _ in $(seq 50); do  # NVML lists a new CUDA context a moment after it is made
    nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qw "$holder_pid" && break
    sleep 0.2
done
show nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv
capture nvml-busy.json

echo
echo "== status and plan, slot dark-compute-a given by index 0 (root: examples/gpu-proof/root)"
show_to "$work/status.json" "${rec[@]}" --root "$root" status --json
show "${rec[@]}" --root "$root" status
show "${rec[@]}" --root "$root" plan
plan_rc=$rc
show_to "$work/plan.json" "${rec[@]}" --root "$root" plan --json

echo
echo "== the same slot named by its UUID"
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
rm -rf "$work/root-uuid"
cp -r "$root" "$work/root-uuid"
sed -i "s|dark-compute-a: {index: 0}|dark-compute-a: {uuid: $uuid}|" "$work/root-uuid/configs/host.yaml"
show grep -n "dark-compute-a" "$work/root-uuid/configs/host.yaml"
show "${rec[@]}" --root "$work/root-uuid" plan
uuid_plan_rc=$rc
show_to "$work/status-uuid.json" "${rec[@]}" --root "$work/root-uuid" status --json

echo
echo "== checks"
checks_rc=0
"$py" - "$work" "$plan_rc" "$uuid_plan_rc" "$uuid" <<'PY' || checks_rc=$?
import json, sys
work, plan_rc, uuid_plan_rc, uuid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
hold = json.load(open(f"{work}/hold.out"))
pid, held = hold["pid"], hold["bytes"]
failed = []
def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failed.append(what)
for name in ("status.json", "status-uuid.json"):
    st = json.load(open(f"{work}/{name}"))
    slot = st["slots"]["dark-compute-a"]
    procs = {p["pid"]: p for p in slot["processes"]}
    check(st["sources"]["gpu"] == "ok", f"{name}: gpu source ok ({st['sources']['gpu']})")
    check(slot["uuid"] == uuid and slot["index"] == 0, f"{name}: slot dark-compute-a is GPU 0 {slot['uuid']}")
    check(pid in procs, f"{name}: pid {pid} listed on dark-compute-a")
    p = procs.get(pid, {})
    check((p.get("used_bytes") or 0) >= held,
          f"{name}: pid {pid} uses {p.get('used_bytes')} bytes >= the {held} it allocated")
    check(p.get("container") is None, f"{name}: pid {pid} attributed to no container ({p.get('container')})")
    check(not slot["free"], f"{name}: slot not free")
plan = json.load(open(f"{work}/plan.json"))
check(plan_rc == 3 and uuid_plan_rc == 3, f"plan exit codes {plan_rc} (index) and {uuid_plan_rc} (uuid): 3 = blocked")
check(plan["blocked"] and not plan["actions"], "plan --json: blocked, no action")
check(any(b["holder"] == f"pid {pid}" for b in plan["blockers"]),
      f"plan --json: a blocker names pid {pid}: {[b['reason'] for b in plan['blockers']]}")
print("PROOF OK" if not failed else f"PROOF FAILED: {len(failed)} check(s)")
sys.exit(1 if failed else 0)
PY

echo
echo "== the CUDA process ends; the same plan now wants to enter"
exec 4>&-
wait "$holder_pid" || true
holder_pid=""
for _ in $(seq 50); do
    "${rec[@]}" --root "$root" plan >/dev/null 2>&1 && break
    [[ $? == 2 ]] && break
    sleep 0.2
done
show "${rec[@]}" --root "$root" plan
[[ $rc == 2 ]] || { echo "expected exit 2 (changes pending) once the GPU is free"; exit 1; }

leave_mib=${LEAVE_FREE_MIB:-1024}
echo
echo "== below the reserve: a real CUDA process takes all of GPU 0's free memory but ${leave_mib} MiB"
show grep -n "gpu_reserve" "$root/configs/host.yaml"
rm -f "$work/hold.in" "$work/hold.out"
mkfifo "$work/hold.in"
"$py" "$here/hold_gpu.py" --index 0 --leave-free-mib "$leave_mib" --seconds 600 <"$work/hold.in" >"$work/hold.out" &
holder_pid=$!
exec 4>"$work/hold.in"
for _ in $(seq 600); do [[ -s "$work/hold.out" ]] && break; sleep 0.2; done
cat "$work/hold.out"
[[ -s "$work/hold.out" ]] || { echo "the CUDA holder did not take GPU memory"; exit 1; }
for _ in $(seq 50); do
    nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qw "$holder_pid" && break
    sleep 0.2
done
show nvidia-smi --query-gpu=index,memory.used,memory.free,memory.total --format=csv
capture nvml-below-reserve.json
show_to "$work/status-below.json" "${rec[@]}" --root "$root" status --json
show_to "$work/status-below.txt" "${rec[@]}" --root "$root" status
echo
echo "-- the enter's reserve check (Applier.check_reserve) on this NVML answer, policy enforce (root/configs/host.yaml)"
show "$py" "$here/reserve_check.py" "$root" failed
enforce_rc=$rc
rm -rf "$work/root-report"
cp -r "$root" "$work/root-report"
sed -i "s|policy: enforce|policy: report|" "$work/root-report/configs/host.yaml"
echo
echo "-- the same check with policy report"
show grep -n "gpu_reserve" "$work/root-report/configs/host.yaml"
show "$py" "$here/reserve_check.py" "$work/root-report" stays
report_rc=$rc

echo
echo "== reserve checks"
"$py" - "$work" "$enforce_rc" "$report_rc" <<'PY' || checks_rc=1
import json, sys
work, enforce_rc, report_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
failed = []
def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failed.append(what)
st = json.load(open(f"{work}/status-below.json"))
slot = st["slots"]["dark-compute-a"]
free, reserve = slot["memory_free_bytes"], slot["reserve_bytes"]
check(st["sources"]["gpu"] == "ok", f"gpu source ok ({st['sources']['gpu']})")
check(reserve == 3 * 1024**3, f"reserve of dark-compute-a is 3 GiB ({reserve})")
check(free is not None and free < reserve, f"free {free} < reserve {reserve}")
check(slot["below_reserve"] is True, f"status --json: below_reserve {slot['below_reserve']}")
text = open(f"{work}/status-below.txt").read()
check("BELOW RESERVE" in text, "status (text) says BELOW RESERVE")
check(enforce_rc == 0, f"enforce: the enter's check fails the enter (reserve_check.py exit {enforce_rc})")
check(report_rc == 0, f"report: the lane stays (reserve_check.py exit {report_rc})")
print("RESERVE PROOF OK" if not failed else f"RESERVE PROOF FAILED: {len(failed)} check(s)")
sys.exit(1 if failed else 0)
PY
exec 4>&-
wait "$holder_pid" || true
holder_pid=""

echo
echo "== a process that opens GPU 0's node and makes no CUDA context: NVML lists nothing, the /proc scan names it"
"$py" -c 'import os, time; fd = os.open("/dev/nvidia0", os.O_RDWR); print("open", flush=True); time.sleep(120)' \
    >"$work/node.out" &
node_pid=$!
for _ in $(seq 50); do [[ -s "$work/node.out" ]] && break; sleep 0.1; done
show_to "$work/plan-node.json" "${rec[@]}" --root "$root" plan --json
node_rc=$rc
show nvidia-smi --query-compute-apps=pid --format=csv,noheader
"$py" - "$work" "$node_pid" "$node_rc" <<'PY' || checks_rc=1
import json, sys
work, pid, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
plan = json.load(open(f"{work}/plan-node.json"))
ok = rc == 3 and any(f"pid {pid}" in b["reason"] or b["holder"] == f"pid {pid}" for b in plan["blockers"])
print(("ok    " if ok else "FAIL  ") + f"plan blocked (exit {rc}) naming pid {pid}, which holds /dev/nvidia0 open: "
      + "; ".join(b["reason"] for b in plan["blockers"]))
print("NODE PROOF OK" if ok else "NODE PROOF FAILED")
sys.exit(0 if ok else 1)
PY
kill "$node_pid" 2>/dev/null || true
wait "$node_pid" 2>/dev/null || true
if [[ -n "${OUT:-}" ]]; then
    cp "$work"/nvml-idle.json "$work"/nvml-busy.json "$work"/nvml-below-reserve.json "$work"/status-below.json "$OUT"/
fi
exit "$checks_rc"
