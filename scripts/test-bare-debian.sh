#!/usr/bin/env bash
# The README's two commands on a bare Debian 12, as a new user's machine has it: a root made by
# `debootstrap --variant=minbase bookworm`, the repository's committed HEAD copied in (what a
# clone holds), then `bash scripts/quickstart.sh` and `bash scripts/test.sh` run in it, in that
# order, by chroot as root. Our own machines have packages a bare one lacks (libgmock-dev was one),
# so a green CI does not prove the quick start; this does. By hand, as root (debootstrap and
# network to the Debian mirror needed; it installs a few GB and builds twice, so it takes a while):
#
#   bash scripts/test-bare-debian.sh                   everything
#   HT_BARE_QUICK=1 bash scripts/test-bare-debian.sh   the quick start with --training.steps=20, and
#                                                      the test command with -R Config (a subset)
#
# Environment: HT_BARE_DIR (default /var/tmp/ht-bare-debian: kept, so a second run skips
# debootstrap; delete it to start afresh), HT_DEBIAN_MIRROR. Each command's output goes to
# $HT_BARE_DIR/<command>.log; the last lines say what passed. Exit status: 0 when both passed.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "test-bare-debian: run as root (debootstrap and chroot)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "test-bare-debian: debootstrap is missing; apt-get install debootstrap" >&2; exit 2; }
dir=${HT_BARE_DIR:-/var/tmp/ht-bare-debian}
mirror=${HT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$dir/root
say() { echo "test-bare-debian: $*"; }

mkdir -p "$dir"
if [ ! -x "$root/bin/bash" ]; then
  say "making $root with debootstrap --variant=minbase bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$dir/debootstrap.log" 2>&1 ||
    { tail -20 "$dir/debootstrap.log"; exit 1; }
  cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://security.debian.org/debian-security bookworm-security main
SOURCES
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
rm -rf "$root/src"
mkdir -p "$root/src"
git archive HEAD | tar -x -C "$root/src"
say "the repository at $(git rev-parse --short HEAD) in $root/src"

mounts=(proc sys dev dev/pts dev/shm)
cleanup() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "$root/${mounts[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mount -t tmpfs -o size=1g tmpfs "$root/dev/shm"

quick=${HT_BARE_QUICK:-}
run() {  # name, command: as the README writes it, in /src, with a new user's environment
  local name=$1 start=$SECONDS status=0
  shift
  say "$name: $* (log: $dir/$name.log)"
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 /bin/bash -c "cd /src && $*" >"$dir/$name.log" 2>&1 || status=$?
  say "$name: exit $status in $((SECONDS - start)) s; its last lines:"
  tail -3 "$dir/$name.log" | sed 's/^/    /'
  return "$status"
}
overall=0
if [ -n "$quick" ]; then
  run quickstart bash scripts/quickstart.sh --training.steps=20 || overall=1
  run tests bash scripts/test.sh -R Config || overall=1
else
  run quickstart bash scripts/quickstart.sh || overall=1
  run tests bash scripts/test.sh || overall=1
fi
say "$( [ $overall = 0 ] && echo "both commands passed" || echo "FAILED" ) on a bare Debian 12 ($(date -u +%Y-%m-%d))"
exit $overall
