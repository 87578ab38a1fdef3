# Shared by tests/fresh/run.sh (the README's two commands) and tests/fresh/host.sh (the tool installed on its own):
# the mirrors apt uses here, the stock Debian image built from them, and the capabilities a container of its own
# engine needs. Sourced, not run: the caller sets here (this folder), out (the logs' folder) and rebuild (yes|no),
# and defines die.

# --- the mirrors apt uses here ------------------------------------------------------------------------------------
# The first Debian archive and security URIs of /etc/apt/sources.list{,.d/*} (deb822 and one-line formats alike);
# other vendors' sources (anything not ending in /debian or /debian-security) are ignored.
apt_uris() {
    { cat /etc/apt/sources.list 2>/dev/null; cat /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null; } |
        sed -e 's/#.*//' |
        awk '/^[[:space:]]*URIs:/ { for (i = 2; i <= NF; i++) print $i }
             /^[[:space:]]*deb[[:space:]]/ { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; break } }' |
        sed -e 's:/*$::'
}
mirror=${FRESH_MIRROR:-$(apt_uris | grep -E '/debian$' | head -1 || true)}
security=${FRESH_SECURITY_MIRROR:-$(apt_uris | grep -E '/debian-security$' | head -1 || true)}
mirror=${mirror:-http://deb.debian.org/debian}
security=${security:-${mirror%/debian}/debian-security}

# --- the image: a stock Debian root, built here ----------------------------------------------------------------
ensure_image() {  # SUITE -> prints the image tag
    local suite=$1 tag=reconciler-fresh/debian:$1 label=reconciler-fresh.sha256 hash current root
    hash=$( { cat "$here/rootfs.sh"; echo "$suite $mirror $security"; } | sha256sum | cut -d' ' -f1)
    mkdir -p "$out"
    exec 9>"$out/.image-$suite.lock"
    flock 9  # two runs at once build it once
    current=$(docker image inspect --format "{{ index .Config.Labels \"$label\" }}" "$tag" 2>/dev/null || true)
    if [ "$rebuild" = no ] && [ "$current" = "$hash" ]; then
        echo "fresh: image $tag is current ($label=${hash:0:12})" >&2
    else
        echo "fresh: building $tag with debootstrap from $mirror (about a minute; log: $out/$suite/debootstrap.log)" >&2
        root=$(mktemp -d /var/tmp/reconciler-fresh-root.XXXXXX)
        mkdir -p "$out/$suite"
        if ! bash "$here/rootfs.sh" "$suite" "$root/fs" "$mirror" "$security" >"$out/$suite/debootstrap.log" 2>&1; then
            tail -20 "$out/$suite/debootstrap.log" >&2
            rm -rf "$root"
            die "debootstrap of $suite failed (log: $out/$suite/debootstrap.log)"
        fi
        tar -C "$root/fs" --numeric-owner -cf - . | docker import \
            --change 'CMD ["/bin/bash"]' \
            --change 'ENV LANG=C.UTF-8' \
            --change "LABEL $label=$hash" \
            --message "stock Debian $suite (debootstrap minbase + make git python3 ca-certificates) for tests/fresh" \
            - "$tag" >/dev/null
        rm -rf "$root"
        echo "fresh: built $tag ($label=${hash:0:12})" >&2
    fi
    flock -u 9
    exec 9>&-
    echo "$tag"
}

# --- the container: a machine of its own, with its own Docker engine ---------------------------------------------
# `--privileged` cannot start on every machine: it asks for every capability, and where the engine's bounding set
# lacks one (a microVM without CAP_SYS_RESOURCE, for one) runc fails with 'unable to apply caps'. So: every
# capability this engine can hand out, and the rest of what --privileged means, one by one.
cap_names=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE
    NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE
    SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL
    SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ)
cap_flags() {
    local pid bnd i flags=(--cap-add ALL)
    pid=$(pidof dockerd 2>/dev/null | awk '{print $1}' || true)
    bnd=$(awk '/^CapBnd:/ {print $2}' "/proc/${pid:-self}/status")
    for i in "${!cap_names[@]}"; do
        (( (16#$bnd >> i) & 1 )) || flags+=(--cap-drop "${cap_names[$i]}")
    done
    echo "${flags[@]}"
}

