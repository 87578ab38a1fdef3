#!/usr/bin/env bash
# The demo: the field report's lifecycle on a GPU-less host, against the real Docker engine.
#   split topology -> exclusive TP=2 offload lane -> back to split -> orphan offload files reclaimed.
# It edits a copy of examples/demo (so the repository stays as it is) and ends converged on the split topology,
# so `reconciler --root examples/demo plan` exits 0 afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
rc() { set +e; "$@"; local code=$?; set -e; echo "(exit $code)"; }
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
r() { echo "\$ reconciler --root \$DEMO $*"; python3 -m reconciler --root "$DEMO" "$@"; }

DEMO=$(mktemp -d /tmp/reconciler-demo.XXXXXX)
trap 'rm -rf "$DEMO"' EXIT
cp -r examples/demo/configs examples/demo/manifests "$DEMO/"
SPLIT=$(cat "$DEMO/manifests/demo.yaml")

step "1. validate the host, recipes and manifest"
r validate

step "2. plan from where the host is now (exit 2: changes pending, 0: nothing to do)"
rc r plan

step "3. apply: converge to the split topology (omni on dark-compute-b, dark-compute-a free)"
r apply --yes
r status

step "4. edit the manifest: the exclusive TP=2 native-offload lane on both slots"
cat >"$DEMO/manifests/demo.yaml" <<'YAML'
host: demo
assignments:
  - recipe: deepseek-256k-offload
    gpus: [dark-compute-a, dark-compute-b]
YAML
rc r plan
r apply --yes

step "5. its offload file is mapped by both workers; the guard refuses to reclaim it while it runs"
r shm status
rc r shm reclaim --confirm

step "6. edit back to the split topology: the TP=2 lane leaves, its offload file goes, omni returns"
printf '%s\n' "$SPLIT" >"$DEMO/manifests/demo.yaml"
r apply --yes
r shm status

step "7. the report's failure: crashed workers leave orphan offload files behind"
for n in 1 2; do
  head -c $((32 * 1024 * 1024)) /dev/zero >"/dev/shm/vllm_offload_demo-orphan-$n.mmap"
done
r shm status
rc r plan
echo "\$ reconciler --root \$DEMO shm reclaim            # dry run"
python3 -m reconciler --root "$DEMO" shm reclaim
r apply --yes
r status

step "done: the demo host is converged; run \`reconciler --root examples/demo plan\` (exit 0) or \`status\`"
