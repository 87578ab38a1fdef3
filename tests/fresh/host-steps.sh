#!/usr/bin/env bash
# Run inside the stock Debian container by tests/fresh/host.sh, as root: README's "On your own GPU host", command
# for command, with one installer (pipx or uv), then the uninstall, then a check that nothing of the tool is left.
#   bash host-steps.sh prepare          the engine (Debian's docker.io) and pipx: what a serving host already has
#   bash host-steps.sh build SRC        the README's build line in a copy of the checkout: SRC/dist/reconciler-*.whl
#   bash host-steps.sh pipx|uv WHEEL    install (over a link like make demo's), init, a recipe, the unit's ExecStart
#                                       as the loop, converge, uninstall
# The lines between '# readme:' markers are the README's own (tests/real/test_host_install.py checks they match).
set -euo pipefail
step() { printf '\n== %s  (%ss)\n' "$*" "$SECONDS"; }
fail() { echo "host-steps: FAIL: $*" >&2; exit 1; }

if [ "$1" = prepare ]; then
    step "prepare: Debian's docker.io and pipx (a serving host has its engine; pipx is the one addition)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends docker.io pipx >/dev/null
    setsid dockerd >/tmp/dockerd.log 2>&1 </dev/null &
    for _ in $(seq 60); do docker version >/dev/null 2>&1 && break; sleep 1; done
    docker version --format 'engine: Docker {{.Server.Version}}' || fail "dockerd did not start (/tmp/dockerd.log)"
    exit 0
fi

if [ "$1" = build ]; then
    step "build: the wheel, as the README builds it (Debian's python3 has no \`build\` module; pipx runs PyPI's)"
    cd "$2"
    # readme: build
    pipx run build
    # readme: end
    ls dist/reconciler-*.whl dist/reconciler-*.tar.gz
    exit 0
fi

installer=$1 wheel=$2
cd "$(dirname "$wheel")"
snapshot() {  # every path outside the kernel's, the engine's and the scratch file systems, sorted
    find / \( -path /proc -o -path /sys -o -path /dev -o -path /tmp -o -path /var/lib/docker -o -path /var/log \
        -o -path /run/docker -o -path /run/containerd -o -path /var/lib/containerd -o -path /wheel \
        -o -path /var/cache \) -prune -o -print | sort
}
snapshot >/tmp/before.txt
demo_link() {  # what `make demo` leaves on a host: /usr/local/bin/reconciler, a link into a checkout's .venv
    mkdir -p /srv/demo-checkout/.venv/bin
    printf '#!/bin/sh\necho "the checkout of make demo, not the install"\n' >/srv/demo-checkout/.venv/bin/reconciler
    chmod +x /srv/demo-checkout/.venv/bin/reconciler
    ln -sfn /srv/demo-checkout/.venv/bin/reconciler /usr/local/bin/reconciler
}

step "$installer: install the wheel"
case $installer in
    pipx)
        demo_link
        # readme: pipx
        PIPX_HOME=/opt/pipx PIPX_BIN_DIR=/usr/local/bin pipx install --force ./reconciler-*.whl
        # readme: end
        ;;
    uv)
        # uv itself, from PyPI, as its own tool on root's PATH (not part of what the check below looks for)
        # readme: uv-itself
        PIPX_HOME=/opt/pipx PIPX_BIN_DIR=/usr/local/bin pipx install uv
        # readme: end
        command -v uv || fail "uv is not on root's PATH after the README's line"
        snapshot >/tmp/before.txt
        demo_link
        # readme: uv
        UV_TOOL_DIR=/opt/uv-tools UV_TOOL_BIN_DIR=/usr/local/bin uv tool install --force ./reconciler-*.whl
        # readme: end
        ;;
    *) fail "installer is pipx or uv, not '$installer'" ;;
esac
command -v reconciler
case $(readlink -f "$(command -v reconciler)") in
    /opt/*) ;;
    *) fail "reconciler on PATH is $(readlink -f "$(command -v reconciler)"), not this install's: make demo's link was kept" ;;
esac
reconciler --version

step "$installer: init, a recipe, the unit"
# readme: init
reconciler --root /etc/reconciler init
reconciler --root /etc/reconciler validate
# readme: end
grep -q '^gpu_telemetry: none' /etc/reconciler/configs/host.yaml || fail "init on a host without NVIDIA GPUs wrote no 'gpu_telemetry: none'"
grep -q '^  url: unix:///var/run/docker.sock' /etc/reconciler/configs/host.yaml || fail "init did not name Docker's socket"
host=$(sed -n 's/^name: //p' /etc/reconciler/configs/host.yaml)
# "Edit recipes": the demo's omni (fake vLLM, one worker) on the one slot init wrote, gpu0.
cp /wheel/omni.toml /etc/reconciler/configs/recipes/omni.toml
printf 'host: %s\nassignments:\n  - recipe: omni\n    gpus: [gpu0]\n' "$host" >"/etc/reconciler/manifests/$host.yaml"
reconciler --root /etc/reconciler validate
# readme: unit
reconciler --root /etc/reconciler systemd-unit > /etc/systemd/system/reconciler.service
# readme: end
exec_start=$(sed -n 's/^ExecStart=//p' /etc/systemd/system/reconciler.service)
echo "ExecStart=$exec_start"
case $exec_start in
    /opt/*/reconciler\ run\ --root\ /etc/reconciler\ --metrics-addr\ 127.0.0.1:9464) ;;
    *) fail "the unit's ExecStart does not name this install: $exec_start" ;;
esac

step "$installer: the loop as the unit starts it (systemd is not pid 1 here: its ExecStart line, its Environment)"
mkdir -p -m 0700 /run/reconciler /var/lib/reconciler  # RuntimeDirectory= and StateDirectory= of the unit
# shellcheck disable=SC2046
env $(sed -n 's/^Environment=//p' /etc/systemd/system/reconciler.service) setsid $exec_start >/tmp/loop.log 2>&1 </dev/null &
loop=$!
converged=no
for _ in $(seq 120); do
    if reconciler --root /etc/reconciler plan >/tmp/plan.txt 2>&1; then converged=yes; break; fi
    kill -0 "$loop" 2>/dev/null || { cat /tmp/loop.log; fail "the loop exited"; }
    sleep 1
done
[ $converged = yes ] || { cat /tmp/plan.txt /tmp/loop.log; fail "the loop did not converge in 120 s"; }
echo "converged at ${SECONDS}s"
reconciler --root /etc/reconciler status
docker ps --filter label=io.reconciler.host="$host" --format '{{.Names}} {{.Status}}' | grep -q '^reconciler-omni-gpu0 Up' ||
    fail "omni's container is not running"
python3 -c 'import urllib.request as u; assert u.urlopen("http://127.0.0.1:8001/health").status == 200' ||
    fail "omni's /health does not answer 200"
# "Point Prometheus at it": the listener serves the metrics, and the rule file comes with the package.
python3 -c 'import urllib.request as u; t = u.urlopen("http://127.0.0.1:9464/metrics").read().decode()
assert "reconciler_build_info{" in t and "reconciler_manifest_valid 1.0" in t, t[:2000]' ||
    fail "/metrics does not serve the loop's metrics"
mkdir -p /etc/prometheus/rules
# readme: rules
reconciler alert-rules > /etc/prometheus/rules/reconciler.yml
# readme: end
grep -q 'ReconcilerDriftPersisting' /etc/prometheus/rules/reconciler.yml || fail "alert-rules printed no rules"

step "$installer: uninstall"
printf 'host: %s\nassignments: []\n' "$host" >"/etc/reconciler/manifests/$host.yaml"
left=no
for _ in $(seq 60); do
    if reconciler --root /etc/reconciler plan >/dev/null 2>&1 &&
        [ -z "$(docker ps -aq --filter label=io.reconciler.host="$host")" ]; then left=yes; break; fi
    sleep 1
done
[ $left = yes ] || { cat /tmp/loop.log; fail "the loop did not leave omni"; }
kill -TERM "$loop"  # systemctl disable --now reconciler
wait "$loop" || fail "the loop exited $? on SIGTERM"
case $installer in
    pipx)
        # readme: pipx-uninstall
        PIPX_HOME=/opt/pipx PIPX_BIN_DIR=/usr/local/bin pipx uninstall reconciler
        # readme: end
        ;;
    uv)
        # readme: uv-uninstall
        UV_TOOL_DIR=/opt/uv-tools UV_TOOL_BIN_DIR=/usr/local/bin uv tool uninstall reconciler && uv cache clean reconciler
        # readme: end
        ;;
esac
# readme: remove
rm -rf /etc/systemd/system/reconciler.service /etc/reconciler /var/lib/reconciler /run/reconciler
rm -f /etc/prometheus/rules/reconciler.yml
# readme: end
rmdir /etc/prometheus/rules /etc/prometheus

step "$installer: nothing of it is left"
rm -rf /srv/demo-checkout  # the stand-in for make demo's checkout: the install replaced its link
snapshot >/tmp/after.txt
diff /tmp/before.txt /tmp/after.txt >/tmp/diff.txt || true
echo "paths that differ from before the install (uv's, pipx's own bookkeeping may show):"
sed 's/^/  /' /tmp/diff.txt
! grep -i 'reconciler' /tmp/diff.txt || fail "the uninstall left files of the tool"
hash -r
! command -v reconciler || fail "a reconciler command is still on PATH"
[ -z "$(docker ps -aq --filter label=io.reconciler.host="$host")" ] || fail "a container of the tool is left"
! ls /dev/shm/vllm_offload_* 2>/dev/null || fail "an offload file is left in /dev/shm"
echo "$installer: done in ${SECONDS}s"
