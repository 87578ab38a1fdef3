#!/usr/bin/env bash
# Proves README's "On your own GPU host" without the checkout's set-up, on a stock Debian 12 container (the
# debootstrapped image of tests/fresh/run.sh) that has only what a serving host has, Debian's Docker engine (its own,
# Docker in Docker) and Python, plus pipx; no `make setup`. There, as root, the README's build line makes the wheel
# from a copy of this checkout (its committed files and what is changed in them), then once with `pipx install` and
# once with `uv tool install` (each over a link like the one `make demo` leaves in /usr/local/bin): `reconciler init`
# writes a root that validates, the demo's omni recipe is added, the loop is started as the unit's ExecStart line
# says, it converges (the fake vLLM's container runs and answers), /metrics answers, and the uninstall leaves no
# file, container or offload file.
#
#   bash tests/fresh/host.sh [--out DIR] [--keep]        make host-install (the same)
#
#   --out DIR  logs (default /tmp/reconciler-host): prepare.log, build.log, pipx.log, uv.log, summary.txt
#   --keep     leave the container running afterwards (docker exec -it NAME bash)
# Needs root, a running Docker engine, debootstrap (for the image, cached), reconciler/fake-vllm:latest
# (examples/fake-vllm/build.sh) and the network to PyPI (build and setuptools for the build, the wheel's
# dependencies, uv). Exit 0 when the build and both installs pass, 1 when one fails, 2 on a set-up error here.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=/tmp/reconciler-host rebuild=no keep=no
while [ $# -gt 0 ]; do
    case $1 in
        --out) out=${2:?--out needs a folder}; shift 2 ;;
        --keep) keep=yes; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "$0: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
die() { echo "host: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "run as root (the container of its own engine needs it)"
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 || die "the Docker engine does not answer; \`make setup\` starts it"
# shellcheck source=tests/fresh/lib.sh
. "$here/lib.sh"
mkdir -p "$out"
rm -f "$out"/*.log "$out/summary.txt"
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

t0=$(now)
dist=$(mktemp -d /tmp/reconciler-host-dist.XXXXXX)
name=
cleanup() {
    if [ -n "$name" ]; then
        if [ "$keep" = yes ]; then echo "host: left running: $name" >&2; else docker rm -f -v "$name" >/dev/null 2>&1 || true; fi
    fi
    rm -rf "$dist"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# The committed tree and what is changed in it, not the checkout's build outputs.
git -C "$repo" ls-files -z --cached --others --exclude-standard | (cd "$repo" && tar --null -T - -cf -) |
    (mkdir -p "$dist/src" && tar -C "$dist/src" -xf -)
mkdir -p "$dist/wheel"
cp "$repo/examples/demo/configs/recipes/omni.toml" "$repo/tests/fresh/host-steps.sh" "$dist/wheel/"
docker image inspect reconciler/fake-vllm:latest >/dev/null 2>&1 ||
    bash "$repo/examples/fake-vllm/build.sh" >>"$out/prepare.log" 2>&1 || die "the fake vLLM image did not build"

image=$(ensure_image bookworm)
name=reconciler-host-$$
caps=$(cap_flags)
# As tests/fresh/run.sh: a machine of its own with its own engine, every capability the engine can hand out.
# shellcheck disable=SC2086
docker run -d --name "$name" --hostname gpu-box --init $caps \
    --security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt systempaths=unconfined \
    --device-cgroup-rule 'a *:* rwm' --cgroupns private -v /var/lib/docker -v "$dist/wheel:/wheel:ro" -v "$dist/src:/src" \
    "$image" sleep infinity >"$out/prepare.log" 2>&1 || die "the container did not start (log: $out/prepare.log)"
docker exec "$name" sh -ec 'mount -o remount,rw /sys; for m in /sys/fs/cgroup/*/; do mount -o remount,bind,rw "$m"; done' \
    >>"$out/prepare.log" 2>&1 || die "preparing the container failed"
envs=()
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    # This machine's certificate authorities (a TLS-inspecting egress): pip and uv must reach PyPI through it.
    tar -C /usr/local/share/ca-certificates -cf - . |
        docker exec -i "$name" sh -ec 'tar -C /usr/local/share/ca-certificates -xf - && update-ca-certificates' >>"$out/prepare.log" 2>&1
    envs=(-e PIP_CERT=/etc/ssl/certs/ca-certificates.crt -e SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt)
fi
os=$(docker exec "$name" sh -c '. /etc/os-release; echo "$PRETTY_NAME, Debian $(cat /etc/debian_version), $(python3 --version)"')
t1=$(now)
docker exec "$name" bash /wheel/host-steps.sh prepare >>"$out/prepare.log" 2>&1 || { tail -5 "$out/prepare.log" >&2; die "prepare failed (log: $out/prepare.log)"; }
docker save reconciler/fake-vllm:latest | docker exec -i "$name" docker load >>"$out/prepare.log" 2>&1 || die "loading the fake vLLM image failed"
prepare_s=$(secs "$t1" "$(now)")
t1=$(now)
echo "host: build  (log: $out/build.log)" >&2
timeout 600 docker exec "${envs[@]}" "$name" bash /wheel/host-steps.sh build /src >"$out/build.log" 2>&1 ||
    { tail -5 "$out/build.log" >&2; echo "host-install: the README's build line failed (log: $out/build.log)" | tee "$out/summary.txt"; exit 1; }
build_s=$(secs "$t1" "$(now)")
wheel=$(cd "$dist/src/dist" && ls reconciler-*.whl)

failed=() lines=()
for installer in pipx uv; do
    echo "host: $installer  (log: $out/$installer.log)" >&2
    t1=$(now)
    set +e
    timeout 600 docker exec "${envs[@]}" "$name" bash /wheel/host-steps.sh "$installer" "/src/dist/$wheel" >"$out/$installer.log" 2>&1
    rc=$?
    set -e
    s=$(secs "$t1" "$(now)")
    conv=$(sed -n 's/^converged at \([0-9]*\)s$/\1/p' "$out/$installer.log")
    lines+=("$(printf '  %-5s exit %-3s %4ss  (install to converged: %ss)' "$installer" "$rc" "$s" "${conv:-?}")")
    [ "$rc" = 0 ] || { failed+=("$installer"); lines+=("$(tail -3 "$out/$installer.log" | sed 's/^/      /')"); }
done
{
    echo "host-install: $os; wheel $wheel"
    echo "  prepare (docker.io, pipx, dockerd, image) ${prepare_s}s, build (pipx run build, in the container) ${build_s}s"
    printf '%s\n' "${lines[@]}"
    echo "  total $(secs "$t0" "$(now)")s; logs: $out/{prepare,build,pipx,uv}.log"
} | tee "$out/summary.txt"
[ ${#failed[@]} = 0 ]
