#!/usr/bin/env bash
# Builds a stock Debian root filesystem in DIR with debootstrap and prints nothing else on success:
#   tests/fresh/rootfs.sh SUITE DIR MIRROR SECURITY_MIRROR
# minbase plus only what a person needs to fetch and start the project: make, git, python3, ca-certificates.
# Everything else (docker.io, prometheus, python3-venv, ...) is the project's own set-up to install.
# run.sh tags the image with a hash of this file, so editing the package list here rebuilds the image.
set -euo pipefail

suite=$1 root=$2 mirror=$3 security=$4
packages=make,git,python3,ca-certificates

debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror"

# The sources a stock installation (and the official Debian images) ships: the release, its updates and security.
rm -f "$root/etc/apt/sources.list"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES

# What docker import cannot use or would leak from this machine: apt's downloaded .debs and lists, the build
# host's name and resolver (docker supplies /etc/hostname, /etc/hosts and /etc/resolv.conf at run time).
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/bootstrap.log
: >"$root/etc/hostname"
: >"$root/etc/resolv.conf"
