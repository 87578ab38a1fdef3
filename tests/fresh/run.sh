#!/usr/bin/env bash
# Proves the README's two commands on a stock Debian machine: a clean clone of this repository's committed HEAD
# is copied into a container of a freshly debootstrapped Debian (minbase + make, git, python3, ca-certificates;
# nothing else), which runs its own Docker engine (Docker in Docker), and there, as root, `make demo` then
# `make test` must both pass. No registry is used: the Debian root is built here from the mirror apt uses here
# and `docker import`ed.
#
#   bash tests/fresh/run.sh [--target bookworm|trixie|all] [--out DIR] [--rebuild] [--keep]
#   make fresh               (the same, bookworm)
#
#   --target   which Debian: bookworm (12, the default), trixie (13, the current stable), or all (both, in turn)
#   --out DIR  where the logs go, one folder per target (default /tmp/reconciler-fresh): setup.log (the
#              container's preparation), demo.log, test.log, dockerd.log (the inner engine's log), summary.txt
#   --rebuild  rebuild the Debian image even when the cached one is current
#   --keep     leave the container running afterwards (to look around: docker exec -it NAME bash)
#
# The image is cached as reconciler-fresh/debian:SUITE, labelled with a hash of tests/fresh/rootfs.sh (which
# holds the package list), the suite and the mirrors: it is rebuilt only when one of them changes.
# Environment: FRESH_MIRROR / FRESH_SECURITY_MIRROR override the mirrors read from /etc/apt/sources*,
# FRESH_TIMEOUT (seconds, default 2400) bounds each of the two commands.
#
# Exit: 0 when both commands pass on every target, 1 when one fails, 2 on a usage or set-up error here.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
targets=bookworm out=/tmp/reconciler-fresh rebuild=no keep=no
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
        --target) targets=${2:?--target needs bookworm, trixie or all}; shift 2 ;;
        --target=*) targets=${1#*=}; shift ;;
        --out) out=${2:?--out needs a folder}; shift 2 ;;
        --out=*) out=${1#*=}; shift ;;
        --rebuild) rebuild=yes; shift ;;
        --keep) keep=yes; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "$0: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
case $targets in
    bookworm|trixie) ;;
    all) targets="bookworm trixie" ;;
    *) echo "$0: --target is bookworm, trixie or all, not '$targets'" >&2; exit 2 ;;
esac
timeout_s=${FRESH_TIMEOUT:-2400}

die() { echo "fresh: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "run as root (debootstrap and the privileged container need it)"
for tool in debootstrap git docker tar sha256sum flock; do
    command -v "$tool" >/dev/null || die "'$tool' is missing here; \`make setup\` installs what this needs"
done
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 || die "the Docker engine does not answer; \`make setup\` starts it"

# The mirrors, the stock Debian image (ensure_image) and the capabilities (cap_flags): tests/fresh/lib.sh.
# shellcheck source=tests/fresh/lib.sh
. "$here/lib.sh"

container=
remove_container() {
    if [ -n "$container" ]; then
        if [ "$keep" = yes ]; then
            echo "fresh: left running: $container (docker exec -it $container bash; docker rm -f -v $container)" >&2
        else
            docker rm -f -v "$container" >/dev/null 2>&1 || true
        fi
    fi
    container=
}
cleanup() {
    remove_container
    [ -z "${clone:-}" ] || rm -rf "$clone"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

clone=$(mktemp -d /tmp/reconciler-fresh-clone.XXXXXX)
git clone --quiet --no-hardlinks "$repo" "$clone/reconciler"
commit=$(git -C "$clone/reconciler" log -1 --format='%h %s' | cut -c1-100)
dirty=$(git -C "$repo" status --porcelain --untracked-files=no | wc -l)

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

run_target() {  # SUITE; adds it to failed when either command fails
    local suite=$1 image dir name caps t0 t1 demo_rc test_rc demo_s test_s line os
    image=$(ensure_image "$suite")
    dir=$out/$suite
    mkdir -p "$dir"
    rm -f "$dir/setup.log" "$dir/demo.log" "$dir/test.log" "$dir/dockerd.log" "$dir/summary.txt"
    name=reconciler-fresh-$suite-$$
    caps=$(cap_flags)
    {
        echo "# container $name from $image"
        echo "# capabilities: $caps"
    } >>"$dir/setup.log"
    # --init: a real init as pid 1 that reaps orphans (dockerd is started detached by .ci/setup-host).
    # --cgroupns private + the remount below: the container sees its own cgroup tree as the root, writable, as a
    #   booted machine does, so the inner engine's containers sit under /docker/ID as they would on one.
    # /var/lib/docker on a volume: the inner engine's overlay2 sits on ext4, not on the container's overlay.
    # /dev/shm stays Docker's default 64 MiB: a small /dev/shm is part of what the demo and tests must live with.
    # shellcheck disable=SC2086
    docker run -d --name "$name" --hostname "fresh-$suite" --init \
        $caps \
        --security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt systempaths=unconfined \
        --device-cgroup-rule 'a *:* rwm' --cgroupns private \
        -v /var/lib/docker \
        --label io.reconciler.fresh="$suite" \
        "$image" sleep infinity >>"$dir/setup.log" 2>&1 || { tail -5 "$dir/setup.log" >&2; die "the container did not start (log: $dir/setup.log)"; }
    container=$name

    # What a booted machine has and a non-privileged container lacks: writable /sys and cgroup mounts.
    docker exec "$name" sh -ec '
        mount -o remount,rw /sys
        for m in /sys/fs/cgroup/*/; do mount -o remount,bind,rw "$m"; done
    ' >>"$dir/setup.log" 2>&1 || die "preparing the container failed (log: $dir/setup.log)"
    # This machine's own certificate authorities (a TLS-inspecting egress, say): without them pip cannot reach
    # PyPI from inside. A stock Debian behind the same network would need them just as well.
    if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
        tar -C /usr/local/share/ca-certificates -cf - . |
            docker exec -i "$name" sh -ec 'tar -C /usr/local/share/ca-certificates -xf - && update-ca-certificates' \
            >>"$dir/setup.log" 2>&1 || die "installing this machine's CA certificates failed (log: $dir/setup.log)"
    fi
    tar -C "$clone" -cf - reconciler | docker exec -i "$name" tar -C /root -xf - >>"$dir/setup.log" 2>&1 ||
        die "copying the clone in failed (log: $dir/setup.log)"
    os=$(docker exec "$name" sh -c '. /etc/os-release; echo "$PRETTY_NAME, Debian $(cat /etc/debian_version)"')

    echo "fresh: $suite: make demo  (log: $dir/demo.log)" >&2
    t0=$(now)
    set +e
    timeout "$timeout_s" docker exec -w /root/reconciler "$name" make demo >"$dir/demo.log" 2>&1
    demo_rc=$?
    t1=$(now); demo_s=$(secs "$t0" "$t1")
    # `make demo` installs only what the demo needs: none of the test tools may be on the machine after it.
    invasive=$(docker exec "$name" sh -c 'for t in podman haproxy prometheus promtool debootstrap; do command -v $t >/dev/null && echo $t; done' || true)
    if [ -n "$invasive" ]; then
        echo "fresh: $suite: make demo installed test tools: $invasive" >>"$dir/demo.log"
        [ "$demo_rc" = 0 ] && demo_rc=3
    fi
    echo "fresh: $suite: make test  (log: $dir/test.log)" >&2
    t0=$(now)
    timeout "$timeout_s" docker exec -w /root/reconciler "$name" make test >"$dir/test.log" 2>&1
    test_rc=$?
    t1=$(now); test_s=$(secs "$t0" "$t1")
    set -e
    docker exec "$name" cat /tmp/reconciler-dockerd.log >"$dir/dockerd.log" 2>/dev/null || true

    # pytest -q closes with e.g. '3 failed, 238 passed, 5 skipped in 78.19s (0:01:18)'.
    line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|errors|skipped|deselected).* in [0-9.]+s' "$dir/test.log" | tail -1 | sed -e 's/^=* *//' -e 's/ *=*$//' || true)
    {
        echo "fresh $suite: $os; repository HEAD $commit"
        printf '  make demo  exit %-3s %5ss\n' "$demo_rc" "$demo_s"
        printf '  make test  exit %-3s %5ss   pytest: %s\n' "$test_rc" "$test_s" "${line:-no closing line (pytest did not run or was cut off)}"
        grep -E '^(FAILED|ERROR) ' "$dir/test.log" | cut -c1-150 | awk '
            NR <= 25 { print "    " $0 } END { if (NR > 25) print "    ... and " NR - 25 " more (test.log, short test summary)" }' || true
        [ -z "$invasive" ] || echo "  make demo installed test tools: $invasive (exit 3)"
        [ "$demo_rc" = 0 ] || { echo "  make demo's last lines:"; tail -5 "$dir/demo.log" | sed 's/^/    /'; }
        if [ "$demo_rc" = 124 ] || [ "$test_rc" = 124 ]; then echo "  (exit 124: stopped after FRESH_TIMEOUT=${timeout_s}s)"; fi
        echo "  logs: $dir/{setup,demo,test,dockerd}.log"
    } >"$dir/summary.txt"
    remove_container
    if [ "$demo_rc" != 0 ] || [ "$test_rc" != 0 ]; then failed+=("$suite"); fi
}

# Called plainly (not in an `if` or `||`), so that `set -e` holds inside it.
failed=()
for suite in $targets; do
    run_target "$suite"
done
echo
[ "$dirty" = 0 ] || echo "note: $dirty uncommitted change(s) in $repo are not part of this check (it uses the committed HEAD)"
for suite in $targets; do cat "$out/$suite/summary.txt"; done
[ ${#failed[@]} = 0 ]
