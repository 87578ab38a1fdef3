#!/bin/sh
# Builds the test image reconciler-test/skeleton:latest (or $IMAGE) without a registry: `docker import` of a
# bare root with Debian's merged-/usr symlinks and nothing else. Containers of it run the host's programs by
# mounting `-v /usr:/usr:ro` (the shm tests run /usr/bin/python3 inside to map an offload file).
#
# Idempotent: the image carries the sha256 of this script as a label and is rebuilt only when that changes
# (or with --force). Run by CI before the tests; the docker tests also call it when the image is missing.
set -eu

image=${IMAGE:-reconciler-test/skeleton:latest}
label=reconciler-test.build-sha256
force=no
for arg in "$@"; do
    case $arg in
        --force) force=yes ;;
        -h|--help) echo "usage: $0 [--force]   (env IMAGE=name:tag, default reconciler-test/skeleton:latest)"; exit 0 ;;
        *) echo "$0: unknown argument '$arg'; usage: $0 [--force]" >&2; exit 2 ;;
    esac
done

if ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    echo "$0: the Docker engine does not answer (docker version failed); start dockerd and retry" >&2
    exit 1
fi
if [ ! -x /usr/bin/python3 ]; then
    echo "$0: /usr/bin/python3 is missing on this host; containers of $image run the host's /usr/bin/python3" >&2
    exit 1
fi

hash=$(sha256sum "$0" | cut -d' ' -f1)
current=$(docker image inspect --format "{{ index .Config.Labels \"$label\" }}" "$image" 2>/dev/null || true)
if [ "$force" = no ] && [ "$current" = "$hash" ]; then
    echo "$image is up to date"
    exit 0
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT INT TERM
mkdir -p "$root/usr" "$root/tmp" "$root/dev" "$root/proc" "$root/sys" "$root/etc" "$root/run" "$root/root" \
    "$root/sbin"
chmod 1777 "$root/tmp"
# The host's /usr, mounted read-only over /usr, supplies binaries, libraries and the dynamic loader at the
# paths they are linked against. /sbin stays a directory so `docker run --init` can mount its init there.
ln -s usr/bin "$root/bin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf - . | docker import \
    --change "LABEL $label=$hash" \
    --change 'CMD ["/usr/bin/sleep", "infinity"]' \
    - "$image" >/dev/null
echo "built $image"
