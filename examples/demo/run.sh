#!/usr/bin/env bash
# The demo: the field report's lifecycle on a GPU-less host, against the real Docker engine.
#   split topology -> a squatter blocks the switch -> exclusive TP=2 offload lane -> back to split
#   -> orphan offload files reclaimed -> functional probes on demand -> a switch that drains requests in flight
#   -> (with the loop) a forced failure of the TP=2 lane, omni as fallback, the fix, the lane, back to split
#   -> (with the front door) sleeping lanes on standby: a client keeps asking one alias through the door while the
#      host switches topologies twice, and never sees an error.
# It edits a copy of examples/demo (so the repository stays as it is) and ends converged on the split topology,
# so `reconciler --root examples/demo plan` exits 0 afterwards. The offload files live on a small tmpfs of the
# demo's own (mounted here at /run/reconciler-demo/shm); the host's /dev/shm is never read or touched.
#
#   bash examples/demo/run.sh              the demo (needs root and a running Docker engine; `make demo` sets up)
#   bash examples/demo/run.sh --teardown   removes everything the demo made: its containers (kept failed ones
#                                          too), its tmpfs and runtime directory, the demo host's state (install
#                                          id, API token, audit trail, saved plans) and its lock file, and
#                                          stops a front door an interrupted run left (its pid in $RUNTIME/door.pid)
#   bash examples/demo/run.sh --teardown --keep-state   the same, but keeps the demo host's state
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
RUNTIME=/run/reconciler-demo        # the demo's runtime directory: its tmpfs is mounted below it
SHM=$RUNTIME/shm                    # must match shm.dir in examples/demo/configs/host.yaml
SQUATTER=reconciler-demo-squatter
DOOR_PID=$RUNTIME/door.pid          # the demo's front door, while it runs (--teardown stops one left behind)
DOOR_URL=http://127.0.0.1:9466      # door.listen's default: examples/demo/configs/host.yaml sets none

if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then BOLD=$'\033[1m' PLAIN=$'\033[0m'; else BOLD='' PLAIN=''; fi
rc() { set +e; "$@"; local code=$?; set -e; echo "(exit $code)"; }
step() { printf '\n%s== %s%s\n' "$BOLD" "$*" "$PLAIN"; }
r() { echo "\$ reconciler --root \$DEMO $*"; "$PYTHON" -m reconciler --root "$DEMO" "$@"; }
r1() { echo "\$ reconciler --root \$DEMO $* 2>/dev/null | tail -1"; "$PYTHON" -m reconciler --root "$DEMO" "$@" 2>/dev/null | tail -1; }

stop_door() {  # the demo's front door, by the pid it wrote, and only while that pid is still `reconciler door`
  local pid
  pid=$(cat "$DOOR_PID" 2>/dev/null) || return 0
  if [[ "$pid" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qE '(-m |/)reconciler .*door'; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    echo "stopped the demo's front door (pid $pid)"
  fi
  rm -f "$DOOR_PID"
}
DEMO=$(mktemp -d /tmp/reconciler-demo.XXXXXX)
LOOP='' CLIENT=''
cleanup() {
  for pid in $CLIENT $LOOP; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  stop_door >/dev/null
  rm -rf "$DEMO" "$SHM/lane-fault"
  docker rm -f "$SQUATTER" >/dev/null 2>&1 || true
}
trap cleanup EXIT
cp -r examples/demo/configs examples/demo/manifests "$DEMO/"
SPLIT=$(cat "$DEMO/manifests/demo.yaml")
EXCLUSIVE='host: demo
assignments:
  - recipe: deepseek-256k-offload
    gpus: [dark-compute-a, dark-compute-b]'

if [ "${1:-}" = "--teardown" ]; then
  stop_door
  printf 'host: demo\nassignments: []\n' >"$DEMO/manifests/demo.yaml"
  if ! mountpoint -q "$SHM"; then mkdir -p "$SHM" && mount -t tmpfs -o size=256m,mode=1777 tmpfs "$SHM"; fi
  r apply --yes
  # apply keeps failed containers for their logs; the demo's own go with the teardown (this host's, by label).
  kept=$(docker ps -aq --filter label=io.reconciler.host=demo)
  if [ -n "$kept" ]; then
    # shellcheck disable=SC2086
    docker rm $kept >/dev/null && echo "removed $(echo "$kept" | wc -l) kept failed container(s) of the demo host"
  fi
  umount "$SHM" && rmdir "$SHM" && echo "unmounted the demo tmpfs $SHM"
  rmdir "$RUNTIME" 2>/dev/null && echo "removed the demo's runtime directory $RUNTIME"
  # Where the tool keeps the demo host's state and lock, as the tool itself computes them ($RECONCILER_STATE_DIR,
  # $RECONCILER_LOCK_DIR or their defaults), so the teardown follows wherever they are.
  read -r state lock loopstate doorstate < <("$PYTHON" -c 'from reconciler.store.door_state import door_state_path
from reconciler.store.lock import HostLock
from reconciler.store.loop_state import state_path
from reconciler.store.state import host_dir
print(host_dir("demo"), HostLock("demo", command="").path, state_path("demo"), door_state_path("demo"))')
  if [ "${2:-}" = "--keep-state" ]; then
    echo "kept the demo host's state in $state (--keep-state)"
  elif [ -d "$state" ]; then
    rm -rf -- "$state" && echo "removed the demo host's state $state (install id, API token, audit trail, saved plans)"
  fi
  rm -f -- "$lock" "$loopstate" "$doorstate" && echo "removed the demo host's lock $lock"
  exit 0
fi

step "0. the demo's own tmpfs for offload files (the host's /dev/shm is left alone)"
if mountpoint -q "$SHM"; then
  echo "$SHM is mounted already (an earlier demo run)"
else
  mkdir -p "$SHM"
  mount -t tmpfs -o size=256m,mode=1777 tmpfs "$SHM"
  echo "mounted a 256 MiB tmpfs on $SHM"
fi

# Containers of the demo host from an earlier version of this tool carry no install id: adopt them, explicitly.
legacy=$(docker ps -a --filter label=io.reconciler.host=demo --format '{{.Names}} {{.Label "io.reconciler.install"}}' \
  | awk 'NF == 1 { print $1 }')
if [ -n "$legacy" ]; then
  step "0b. containers of an earlier demo run, made before install ids: adopted, explicitly"
  # shellcheck disable=SC2086
  r adopt $legacy
fi

step "1. validate the host, recipes and manifest"
r validate

step "2. plan from where the host is now (exit 2: changes pending, 0: nothing to do)"
rc r plan

step "3. apply: converge to the split topology (omni on dark-compute-b, dark-compute-a free)"
r apply --yes
r status

step "4. someone starts a container by hand on GPU 0 (dark-compute-a); the tool does not own it"
echo "\$ docker run -d --name $SQUATTER -e NVIDIA_VISIBLE_DEVICES=0 reconciler/fake-vllm:latest ..."
docker rm -f "$SQUATTER" >/dev/null 2>&1 || true
docker run -d --name "$SQUATTER" -e NVIDIA_VISIBLE_DEVICES=0 -v /usr:/usr:ro \
  reconciler/fake-vllm:latest python3 -c 'import time; time.sleep(3600)' | cut -c1-12

step "5. edit the manifest: the exclusive TP=2 native-offload lane on both slots; the squatter blocks it (exit 3)"
printf '%s\n' "$EXCLUSIVE" >"$DEMO/manifests/demo.yaml"
cat "$DEMO/manifests/demo.yaml"
rc r plan
rc r apply --yes
echo "(the manifest is as the operator wrote it, and omni still runs: nothing was stopped)"
r status

step "6. the operator removes the squatter; the same manifest now converges"
echo "\$ docker rm -f $SQUATTER"
docker rm -f "$SQUATTER" >/dev/null
r apply --yes

step "7. its offload file is mapped by both workers; the guard refuses to reclaim it while it runs"
r shm status
rc r shm reclaim --confirm

step "8. edit back to the split topology: the TP=2 lane leaves, its offload file goes, omni returns"
printf '%s\n' "$SPLIT" >"$DEMO/manifests/demo.yaml"
r apply --yes
r shm status

step "9. the report's failure: crashed workers leave orphan offload files behind"
for n in 1 2; do
  head -c $((32 * 1024 * 1024)) /dev/zero >"$SHM/vllm_offload_demo-orphan-$n.mmap"
done
r shm status
rc r plan
echo "\$ reconciler --root \$DEMO shm reclaim            # dry run"
"$PYTHON" -m reconciler --root "$DEMO" shm reclaim
r apply --yes
r status

step "10. functional preflight on demand: the probes every enter runs after /health answers"
r probe omni
echo
echo "# the report's lifecycle regression, on demand only: a ~128K needle and 20 tool calls behind one shared prefix"
r probe omni --suite regression
echo
echo "# one of the twenty fails (the stand-in told so at run time): the suite fails, naming the request"
curl -s -X POST http://127.0.0.1:8001/fake/mode -d '{"mode": "fail-request='"'"'ORD-7'"'"'"}' >/dev/null
rc r probe omni --suite regression
curl -s -X POST http://127.0.0.1:8001/fake/mode -d '{"mode": ""}' >/dev/null

step "11. drain before leave: two requests in flight to omni; the switch waits for them, and they get their answers"
OMNI=http://127.0.0.1:8001
for n in 1 2; do
  curl -s --max-time 120 "$OMNI/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"demo/omni\", \"fake_hold_s\": 60, \"messages\": [{\"role\": \"user\", \"content\": \"request $n\"}]}" \
    >"$DEMO/answer-$n.json" &
done
sleep 1
echo "\$ curl -s $OMNI/metrics | grep '^vllm:'"
curl -s "$OMNI/metrics" | grep '^vllm:'
printf '%s\n' "$EXCLUSIVE" >"$DEMO/manifests/demo.yaml"
# The requests finish 3 s into the drain (the fake's POST /fake/release lets held requests go on).
( sleep 3; curl -s -X POST "$OMNI/fake/release" >/dev/null ) &
r apply --yes
wait
for n in 1 2; do echo "answer $n: $(grep -o '"content": "[^"]*"' "$DEMO/answer-$n.json")"; done
printf '%s\n' "$SPLIT" >"$DEMO/manifests/demo.yaml"
r apply --yes

step "12. a forced failure with fallback: the TP=2 lane fails to start, omni comes back until its next attempt"
echo "(reconciler run, the loop, in the background; the lane fails at start while $SHM/lane-fault exists)"
"$PYTHON" -m reconciler --root "$DEMO" run --metrics-addr 127.0.0.1:19464 --backoff-base 8 >"$DEMO/loop.log" 2>&1 &
LOOP=$!
echo fail-start >"$SHM/lane-fault"
printf '%s\n' "$EXCLUSIVE" >"$DEMO/manifests/demo.yaml"
until_json() {  # poll `status --json` until the Python expression over it (d) is true, at most $2 seconds
  local deadline=$((SECONDS + $2))
  until "$PYTHON" -m reconciler --root "$DEMO" status --json 2>/dev/null | "$PYTHON" -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if ($1) else 1)"; do
    [ $SECONDS -lt $deadline ] || { echo "timed out waiting for: $1"; tail -20 "$DEMO/loop.log"; return 1; }
    sleep 0.5
  done
}
until_json 'd["plan"]["fallbacks"] and any(c["recipe"] == "omni" and c["state"] == "running" for c in d["containers"])' 60
grep -E ' (action|fallback|backoff) ' "$DEMO/loop.log"
r status
rc r plan
echo "\$ curl -s 127.0.0.1:19464/metrics | grep fallback_active"
curl -s 127.0.0.1:19464/metrics | grep '^reconciler_fallback_active'
echo "\$ rm $SHM/lane-fault          # the fix; the recipe is unchanged, so the next attempt waits for its backoff"
rm -f "$SHM/lane-fault"
until_json 'd["converged"] and any(c["recipe"] == "deepseek-256k-offload" and c["state"] == "running" for c in d["containers"])' 90
grep -E ' (action|fallback-ended) ' "$DEMO/loop.log" | tail -3
echo "(and back to the split topology, by the loop: the lane drains, leaves, omni enters)"
printf '%s\n' "$SPLIT" >"$DEMO/manifests/demo.yaml"
until_json 'd["converged"] and [c["recipe"] for c in d["containers"] if c["state"] == "running"] == ["omni"]' 60
kill "$LOOP"; wait "$LOOP" 2>/dev/null || true
LOOP=''
echo "(the loop stopped)"
r audit --since 5m | tail -8

step "13. one endpoint for every model: a client keeps asking one alias through the front door while the host switches"
echo "(examples/demo/sleeping: the split (chat-a, chat-b) and the TP=2 lane tp2, both on standby; the alias chat is chat-a)"
cp examples/demo/sleeping/*.toml "$DEMO/configs/recipes/"
cp examples/demo/sleeping/demo.yaml "$DEMO/manifests/demo.yaml"
r1 apply --yes
echo "(reconciler door, the front door, in the background on $DOOR_URL; an OpenAI client's base_url is $DOOR_URL/v1)"
stop_door  # one an interrupted run left would hold the port
"$PYTHON" -m reconciler --root "$DEMO" door >"$DEMO/door.log" 2>&1 &
echo $! >"$DOOR_PID"
deadline=$((SECONDS + 30))
until curl -sf "$DOOR_URL/healthz" >/dev/null; do
  [ $SECONDS -lt $deadline ] && kill -0 "$(cat "$DOOR_PID")" 2>/dev/null || { echo "the door did not start:"; cat "$DEMO/door.log"; exit 1; }
  sleep 0.2
done
echo "\$ curl -s $DOOR_URL/v1/models | jq -c '[.data[] | {id, state: .reconciler.state}]'"
curl -s "$DOOR_URL/v1/models" | jq -c '[.data[] | {id, state: .reconciler.state}]'
echo "\$ python examples/demo/door-client.py --base-url $DOOR_URL/v1 --model chat ...   # streams, one request after another"
rm -f "$DEMO/client-stop"
"$PYTHON" examples/demo/door-client.py --base-url "$DOOR_URL/v1" --model chat --until "$DEMO/client-stop" \
  --min-switches 2 &
CLIENT=$!
sleep 2
r1 switch exclusive --wait
echo "(chat-a sleeps: the door holds the client's requests for chat until its topology runs again)"
sleep 2
r1 switch split --wait
sleep 1
touch "$DEMO/client-stop"
client=0
wait "$CLIENT" || client=$?
CLIENT=''
stop_door
if [ "$client" -ne 0 ]; then
  echo "the door's client saw an error (exit $client): the door's log follows"
  cat "$DEMO/door.log"
  exit 1
fi
echo "(and the demo's own manifest back: the sleeping lanes leave, omni enters)"
printf '%s\n' "$SPLIT" >"$DEMO/manifests/demo.yaml"
rm "$DEMO"/configs/recipes/{chat-a,chat-b,tp2}.toml
r1 apply --yes

step "done: the demo host is converged"
cat <<EOF
Left running: omni on dark-compute-b (container reconciler-omni-dark-compute-b), and the demo's tmpfs on $SHM.
\`reconciler\` is on the PATH ($(command -v reconciler || echo "not yet: run make setup, which links .venv/bin/reconciler into /usr/local/bin")):
  reconciler --root examples/demo plan       # exit 0: nothing to do
  reconciler --root examples/demo status
To tear it all down (containers, tmpfs, the demo host's state and lock; --keep-state keeps its state):
  bash examples/demo/run.sh --teardown
EOF
