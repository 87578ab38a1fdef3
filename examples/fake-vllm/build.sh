#!/bin/sh
# Builds the image reconciler/fake-vllm:latest (or $IMAGE) without a registry: `docker import` of a skeleton
# root made on the fly. The image holds only /app/fake_vllm.py, minimal /etc files and merged-/usr symlinks;
# containers get Python from the host by mounting `-v /usr:/usr:ro`.
#
# Idempotent: the image carries the sha256 of fake_vllm.py and this script as a label, and nothing is
# rebuilt while that label matches. `--force` rebuilds anyway. Used by the demo (examples/demo/) and by the
# end-to-end tests, which call it before starting containers.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
image=${IMAGE:-reconciler/fake-vllm:latest}
label=fake-vllm.content-sha256
force=no
for arg in "$@"; do
    case $arg in
        --force) force=yes ;;
        -h|--help) echo "usage: $0 [--force]   (env IMAGE=name:tag, default reconciler/fake-vllm:latest)"; exit 0 ;;
        *) echo "$0: unknown argument '$arg'; usage: $0 [--force]" >&2; exit 2 ;;
    esac
done

if ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    echo "$0: the Docker engine does not answer (docker version failed); start dockerd and retry" >&2
    exit 1
fi
if [ ! -x /usr/bin/python3 ]; then
    # Not fatal for the build, but every container of this image runs the host's /usr/bin/python3.
    echo "$0: warning: /usr/bin/python3 is missing on this host; containers mount the host's /usr for Python" >&2
fi

hash=$(cat "$here/fake_vllm.py" "$here/build.sh" | sha256sum | cut -d' ' -f1)
current=$(docker image inspect --format "{{ index .Config.Labels \"$label\" }}" "$image" 2>/dev/null || true)
if [ "$force" = no ] && [ "$current" = "$hash" ]; then
    echo "$image is up to date ($label=$hash)"
    exit 0
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT INT TERM
# /sbin stays a real directory: `docker run --init` (recipes' `init = true`) mounts its init at
# /sbin/docker-init, which cannot be created inside the read-only host /usr that a symlink would point to.
mkdir -p "$root/app/bin" "$root/usr" "$root/tmp" "$root/dev" "$root/proc" "$root/sys" "$root/etc" \
    "$root/run" "$root/root" "$root/sbin"
chmod 1777 "$root/tmp"
# Merged /usr as on Debian 12: the host's /usr, mounted read-only, then supplies binaries, libraries and
# the dynamic loader (/lib64/ld-linux-x86-64.so.2) at the paths they are linked against.
ln -s usr/bin "$root/bin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
cp "$here/fake_vllm.py" "$root/app/fake_vllm.py"
chmod 0755 "$root/app/fake_vllm.py"
# `vllm serve MODEL ...`, as real recipes write it, runs the stand-in.
ln -s ../fake_vllm.py "$root/app/bin/vllm"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf - . | docker import \
    --change 'CMD ["vllm", "serve", "fake/model"]' \
    --change 'ENV PATH=/app/bin:/usr/bin:/usr/sbin:/usr/local/bin' \
    --change 'ENV PYTHONUNBUFFERED=1' \
    --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
    --change 'WORKDIR /app' \
    --change 'EXPOSE 8000' \
    --change "LABEL $label=$hash" \
    --message "fake vLLM for the reconciler demo and tests ($label=$hash)" \
    - "$image" >/dev/null
echo "built $image ($label=$hash)"
