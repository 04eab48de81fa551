#!/usr/bin/env bash
# Builds docker/Dockerfile.cpu with podman and runs, inside the image, the quick start and a
# 2-rank mpirun checked against the 1-rank run with the same global batch (scripts/same_losses.py).
#
#   sudo bash docker/test-image.sh [--rebuild-base] [--quick]
#
# Needs root, podman and debootstrap (apt-get install podman debootstrap). No image is pulled:
# the Debian base the Dockerfile names (docker.io/library/debian:12-slim) is made by debootstrap
# from Debian's packages and tagged locally under that name, so the Dockerfile stays the one a
# user builds with docker. Where containers cannot start (this project's CI machines), the build
# uses `--isolation chroot` and the jobs run by chroot in `podman image mount`'s root file system,
# as the user and with the environment the image declares. --quick trains 200 steps, not the
# quick start's 3 epochs. Takes about 15 minutes on 2 cores (most of it compiling).
set -euo pipefail
cd "$(dirname "$0")/.."
base=docker.io/library/debian:12-slim
image=localhost/hybrid_train:cpu
mirror=${HT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
rebuild_base=0
quick_steps=""
for arg in "$@"; do
  case "$arg" in
    --rebuild-base) rebuild_base=1 ;;
    --quick) quick_steps="--training.steps=200" ;;
    *) echo "test-image: unknown argument $arg; use --rebuild-base or --quick" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" != 0 ]; then echo "test-image: run as root (podman image mount and chroot need it)" >&2; exit 2; fi
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { echo "test-image: $tool is missing; apt-get install podman debootstrap" >&2; exit 2; }
done
say() { echo "test-image: $*"; }
work=$(mktemp -d /var/tmp/ht-test-image.XXXXXX)
mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  podman image unmount "$image" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# 1. The base image, from Debian's packages.
if [ "$rebuild_base" = 1 ] || ! podman image exists "$base"; then
  say "making $base with debootstrap from $mirror"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log"; exit 1; }
  cat >"$work/rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian}/debian-security bookworm-security main
SOURCES
  rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/archives/"*.deb
  tar -C "$work/rootfs" -c . | podman import --quiet --change 'CMD ["bash"]' - "$base" >/dev/null
  rm -rf "$work/rootfs"
fi

# 2. The image, as a user builds it (the Dockerfile unchanged; nothing pulled).
say "building $image from docker/Dockerfile.cpu"
start=$(date +%s)
podman build --isolation chroot --pull=never -f docker/Dockerfile.cpu -t "$image" . >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; say "FAILED: podman build (log above)"; exit 1; }
say "built in $(( $(date +%s) - start )) s; $(podman image inspect --format '{{.Size}}' "$image" | numfmt --to=iec) in all"

# 3. Its root file system, with what a container runtime would provide: /proc, /dev, /sys, a
# writable /tmp and a writable runs/ folder (the image's own layers stay read-only).
root=$(podman image mount "$image")
runs="$work/runs"
mkdir -p "$runs"
chown 1000:1000 "$runs"
bind() { mount "$@"; mounted+=("${!#}"); }
bind -t proc proc "$root/proc"
bind --rbind /dev "$root/dev"
bind --rbind /sys "$root/sys"
bind -t tmpfs -o size=2g tmpfs "$root/tmp"
bind -t tmpfs -o size=1g tmpfs "$root/dev/shm"
bind --bind "$runs" "$root/home/hybrid/runs"
user=$(podman image inspect --format '{{.Config.User}}' "$image")
workdir=$(podman image inspect --format '{{.Config.WorkingDir}}' "$image")
mapfile -t image_env < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$image" | sed '/^$/d')
inside() {  # runs a command in the image as its user, in its working directory, with its environment
  chroot --userspec="$user:$user" "$root" /usr/bin/env -i "${image_env[@]}" HOME="/home/$user" \
    /bin/bash -c "cd $workdir && $*"
}
summary() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$runs/$1/summary.json" "$2"; }

# 4. The quick start, as the image's CMD runs it.
read -r -a cmd < <(podman image inspect --format '{{range .Config.Cmd}}{{.}} {{end}}' "$image")
say "quick start inside the image: ${cmd[*]} $quick_steps"
inside "${cmd[*]} $quick_steps" 2>&1 | tee "$work/quickstart.log" | grep -E "^(step [0-9]*[05]00/|eval at|done)" || true
grep -q "^done: " "$work/quickstart.log" || { tail -20 "$work/quickstart.log"; say "FAILED: quick start"; exit 1; }
for f in summary.json report.html metrics.jsonl; do
  [ -s "$runs/quickstart/$f" ] || { say "FAILED: the quick start wrote no $f"; exit 1; }
done
say "quick start: $(summary quickstart steps) steps, eval accuracy $(summary quickstart eval_accuracy)"

# 5. Two data-parallel ranks by mpirun against one rank, the same global batch: the MLP without
# dropout, whose 2 ranks must train as 1 (the ConvNet's batch norm sees each rank's half batch).
job="configs/quickstart.toml --model.name=mlp --model.dropout=0 --training.steps=100 --checkpoint.interval=0 --metrics.log_interval=1"
inside "hybrid_train $job --job.output_dir=runs/one" >"$work/one.log" 2>&1 || { tail "$work/one.log"; exit 1; }
say "mpirun -np 2 inside the image"
inside "mpirun -np 2 hybrid_train $job --job.output_dir=runs/two" 2>&1 | tee "$work/two.log" | grep -E "^(step [0-9]*0/|done)" || true
grep -q "^done: " "$work/two.log" || { tail -30 "$work/two.log"; say "FAILED: mpirun -np 2"; exit 1; }
python3 scripts/same_losses.py "$runs/one" "$runs/two" || { say "FAILED: 2 ranks did not train as 1"; exit 1; }
say "passed on $(date -u +%Y-%m-%d)"
