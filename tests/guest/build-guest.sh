#!/bin/bash
# build-guest.sh OUTDIR: the test guest of the VM tests, built from Debian packages only and
# cached in OUTDIR (the build directory's guest/): nothing is fetched but what apt-get download
# takes from the machine's package sources.
#
#   vmlinuz         the kernel of linux-image-<version>-cloud-amd64 (the package the
#                   linux-image-cloud-amd64 metapackage depends on), unpacked with dpkg-deb -x
#   initrd.img      a gzip'd newc cpio: busybox-static (its init as PID 1), the virtio, ACPI
#                   button and evdev modules of that kernel (insmod'ed in order: dpkg-deb runs no
#                   depmod), qemu-guest-agent with the shared libraries ldd lists, acpid with a
#                   power-button handler, /sbin/shutdown -> poweroff -f, a writable /run
#   disk.qcow2      a 16 MiB disk whose first bytes are DISK_MARKER (the root disk overlays of
#                   the VMs are linked clones of it)
#   guest.tar       the VM image (README "Virtual machines"): vm.json + the three files above
#   guest-noagent.tar  the same guest told (pivirt.noagent on its command line) not to start
#                   its guest agent
#   guest-oneshot.tar  the same guest told (pivirt.oneshot) to write three PIVIRT-ONESHOT lines
#                   on its console once it has booted, then power off (a lambda for RunAndWait)
#
# The guest prints READY_MARKER on its serial console once init has set everything up; its
# agent answers shortly after. Idempotent: the outputs are rebuilt only when a package version
# or this script changes (OUTDIR/stamp holds what they were built from). Concurrent runs wait
# for each other (flock on OUTDIR/.lock).
set -euo pipefail

READY_MARKER=PIVIRT-GUEST-READY
DISK_MARKER=PIVIRT-DISK-v1
MODULES=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover
    net_failover virtio_net virtio_blk virtio_console virtio_balloon button evdev)

die() {
    printf 'build-guest: error: %s\n' "$*" >&2
    exit 1
}
say() { printf 'build-guest: %s\n' "$*" >&2; }

(($# == 1)) || die "usage: build-guest.sh OUTDIR"
out=$1
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec 8>"$out/.lock"
flock 8

for tool in apt-get apt-cache dpkg-deb qemu-img ldd gzip sha256sum tar; do
    command -v "$tool" >/dev/null || die "$tool not found (Debian 12 with qemu-utils expected)"
done

candidate() {
    apt-cache show --no-all-versions "$1" 2>/dev/null | awk '/^Version:/ {print $2; exit}'
}

kernel_pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[[ -n $kernel_pkg ]] || die "apt-cache knows no linux-image-cloud-amd64 (run apt-get update)"
declare -A version
for p in "$kernel_pkg" busybox-static qemu-guest-agent; do
    version[$p]=$(candidate "$p")
    [[ -n ${version[$p]} ]] || die "apt-cache has no version of $p (run apt-get update)"
done
script_sum=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)
stamp="$kernel_pkg=${version[$kernel_pkg]} busybox-static=${version[busybox-static]}"
stamp+=" qemu-guest-agent=${version[qemu-guest-agent]} script=$script_sum"

if [[ -f $out/stamp && $(cat "$out/stamp") == "$stamp" && -f $out/guest.tar &&
    -f $out/guest-noagent.tar && -f $out/guest-oneshot.tar ]]; then
    exit 0
fi
say "building the test guest in $out ($stamp)"

work=$(mktemp -d "$out/work.XXXXXX")
trap 'rm -rf "$work"' EXIT
debs=$work/debs
mkdir -p "$debs" "$work/kernel" "$work/busybox" "$work/ga"
(cd "$debs" && apt-get download -q "$kernel_pkg=${version[$kernel_pkg]}" \
    "busybox-static=${version[busybox-static]}" \
    "qemu-guest-agent=${version[qemu-guest-agent]}" >/dev/null 2>"$work/download.err") ||
    die "apt-get download failed: $(tail -3 "$work/download.err")"
dpkg-deb -x "$debs"/linux-image-*.deb "$work/kernel"
dpkg-deb -x "$debs"/busybox-static_*.deb "$work/busybox"
dpkg-deb -x "$debs"/qemu-guest-agent_*.deb "$work/ga"
bb=$work/busybox/bin/busybox
[[ -x $bb ]] || die "busybox-static holds no bin/busybox"

# ---- the initramfs tree
root=$work/root
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc/init.d,etc/acpi/PWRF,lib/pivirt-modules,lib64}
mkdir -p "$root"/{proc,sys,dev,run,tmp,var/log,root,usr/share/udhcpc}
ln -s ../run "$root/var/run"
cp "$bb" "$root/bin/busybox"
while read -r applet; do
    [[ -e $root/$applet ]] && continue
    depth=${applet//[^\/]/}
    up=""
    for ((i = 0; i < ${#depth}; i++)); do up+="../"; done
    ln -s "${up}bin/busybox" "$root/$applet"
done < <("$bb" --list-full)
ln -s bin/busybox "$root/init"

kmods=$(find "$work/kernel/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -1)
for m in "${MODULES[@]}"; do
    ko=$(find "$kmods" -name "$m.ko" | head -1)
    [[ -n $ko ]] || die "$kernel_pkg has no module $m.ko"
    cp "$ko" "$root/lib/pivirt-modules/"
done

cp "$work/ga/usr/sbin/qemu-ga" "$root/usr/sbin/qemu-ga"
# the libraries qemu-ga needs, from this machine's Debian packages (ldd exits 1 on a static
# binary: qemu-ga is not one)
ldd_out=$(ldd "$root/usr/sbin/qemu-ga") || die "ldd qemu-ga failed"
if grep -q 'not found' <<<"$ldd_out"; then
    die "qemu-ga needs libraries this machine lacks: $(grep 'not found' <<<"$ldd_out" | tr -s ' \t\n' ' ')"
fi
while read -r lib; do
    [[ -n $lib ]] || continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done < <(awk '/=>/ {print $3} !/=>/ && $1 ~ /^\// {print $1}' <<<"$ldd_out")

cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
EOF
echo 'root:x:0:' >"$root/etc/group"
cat >"$root/etc/os-release" <<'EOF'
NAME="pivirt test guest"
ID=pivirt-guest
VERSION_ID=1
PRETTY_NAME="pivirt test guest (busybox, Debian packages)"
EOF
echo pivirt-guest >"$root/etc/hostname"

cat >"$root/etc/inittab" <<'EOF'
::sysinit:/etc/init.d/rcS
::respawn:/etc/init.d/agent
::respawn:/sbin/acpid -f -c /etc/acpi -l /run/acpid.log
::ctrlaltdel:/sbin/reboot
::shutdown:/bin/sync
EOF

cat >"$root/etc/init.d/rcS" <<EOF
#!/bin/sh
# The guest's set-up, run once by busybox init before anything else.
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs tmpfs /tmp
hostname -F /etc/hostname
for m in ${MODULES[*]}; do
    insmod /lib/pivirt-modules/\$m.ko || echo "pivirt-guest: insmod \$m failed"
done
ip link set lo up
if [ -e /sys/class/net/eth0 ]; then
    ip link set eth0 up
    udhcpc -i eth0 -b -t 5 -T 1 -s /usr/share/udhcpc/default.script >/dev/null 2>&1
fi
# no udev: the agent's port gets its /dev/virtio-ports name by hand once the host has named it
if ! grep -q pivirt.noagent /proc/cmdline; then
    i=0
    while [ \$i -lt 100 ]; do
        for n in /sys/class/virtio-ports/vport*/name; do
            [ -r "\$n" ] && [ "\$(cat "\$n")" = org.qemu.guest_agent.0 ] &&
                port=\$(basename "\$(dirname "\$n")")
        done
        [ -n "\$port" ] && break
        sleep 0.1
        i=\$((i + 1))
    done
    if [ -n "\$port" ]; then
        mkdir -p /dev/virtio-ports
        ln -sf "/dev/\$port" /dev/virtio-ports/org.qemu.guest_agent.0
    else
        echo "pivirt-guest: no org.qemu.guest_agent.0 port"
    fi
fi
echo "$READY_MARKER"
# a one-shot guest (a lambda: RunAndWait): says what it did on its console and powers off
if grep -q pivirt.oneshot /proc/cmdline; then
    echo "PIVIRT-ONESHOT-BEGIN"
    echo "PIVIRT-ONESHOT-KERNEL \$(uname -r)"
    echo "PIVIRT-ONESHOT-END"
    sync
    poweroff -f
fi
EOF

cat >"$root/etc/init.d/agent" <<'EOF'
#!/bin/sh
# Respawned by init: the QEMU guest agent on its virtio-serial port, or nothing (a long sleep)
# when the guest is told not to run one or has no port.
p=/dev/virtio-ports/org.qemu.guest_agent.0
if grep -q pivirt.noagent /proc/cmdline || [ ! -e $p ]; then exec sleep 3600; fi
exec /usr/sbin/qemu-ga -m virtio-serial -p $p -t /run -l /run/qemu-ga.log
EOF

cat >"$root/etc/acpi/PWRF/00000080" <<'EOF'
#!/bin/sh
# The ACPI power button (virDomainShutdown): power off now.
sync
exec /sbin/poweroff -f
EOF

cat >"$root/sbin/shutdown" <<'EOF'
#!/bin/sh
# qemu-ga's guest-shutdown runs "shutdown -P +0"; busybox has no shutdown.
sync
exec /sbin/poweroff -f
EOF

cat >"$root/usr/share/udhcpc/default.script" <<'EOF'
#!/bin/sh
case $1 in
bound | renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" dev "$interface"
    [ -n "$router" ] && ip route add default via "${router%% *}" dev "$interface"
    ;;
esac
exit 0
EOF
chmod 0755 "$root/etc/init.d/rcS" "$root/etc/init.d/agent" "$root/etc/acpi/PWRF/00000080" \
    "$root/sbin/shutdown" "$root/usr/share/udhcpc/default.script"

# ---- the image files
img=$work/image
mkdir -p "$img"
cp "$(find "$work/kernel/boot" -name 'vmlinuz-*' | head -1)" "$img/vmlinuz"
(cd "$root" && find . | LC_ALL=C sort | "$bb" cpio -o -H newc 2>/dev/null) | gzip -6 >"$img/initrd.img"
raw=$work/disk.raw
printf '%s\n' "$DISK_MARKER" >"$raw"
truncate -s 16M "$raw"
qemu-img convert -q -f raw -O qcow2 "$raw" "$img/disk.qcow2"

vm_json() {
    printf '{"kernel": "vmlinuz", "initrd": "initrd.img", "cmdline": "%s"}\n' "$1"
}
vm_json "console=ttyS0 panic=-1" >"$img/vm.json"
tar -C "$img" -cf "$work/guest.tar" vm.json vmlinuz initrd.img disk.qcow2
vm_json "console=ttyS0 panic=-1 pivirt.noagent" >"$img/vm.json"
tar -C "$img" -cf "$work/guest-noagent.tar" vm.json vmlinuz initrd.img disk.qcow2
vm_json "console=ttyS0 panic=-1 pivirt.oneshot" >"$img/vm.json"
tar -C "$img" -cf "$work/guest-oneshot.tar" vm.json vmlinuz initrd.img disk.qcow2

for f in vmlinuz initrd.img disk.qcow2; do mv -f "$img/$f" "$out/$f"; done
mv -f "$work/guest.tar" "$out/guest.tar"
mv -f "$work/guest-noagent.tar" "$out/guest-noagent.tar"
mv -f "$work/guest-oneshot.tar" "$out/guest-oneshot.tar"
printf '%s\n' "$READY_MARKER" >"$out/ready-marker"
printf '%s\n' "$DISK_MARKER" >"$out/disk-marker"
printf '%s\n' "$stamp" >"$out/stamp"
say "built $(du -h "$out/guest.tar" | cut -f1) guest.tar"
