#!/usr/bin/env bash
# Make the image's base, debian:bookworm-slim, available to the local Docker engine.
#
#   docker/base-image.sh            # already there: nothing; else `docker pull`; else build it (below)
#   docker/base-image.sh --build    # build it from Debian's archive even when the registry is reachable
#
# Where Docker's registry cannot be reached (only package registries are), the base is built the way the official
# image is made: `debootstrap --variant=minbase bookworm` from Debian's archive (deb.debian.org, or MIRROR), the
# same apt sources (bookworm, bookworm-updates, bookworm-security) and the same dpkg/apt settings of the official
# slim image (no man pages, docs or locales kept; no apt caches), imported and tagged under the official name, so the
# Dockerfile stays `FROM debian:bookworm-slim` and a user with internet needs no extra step. Needs root and
# debootstrap (apt-get install debootstrap). About 35 s and 80 MB.
set -euo pipefail

IMAGE="${BASE_IMAGE:-debian:bookworm-slim}"
SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${SECURITY_MIRROR:-http://deb.debian.org/debian-security}"

log() { printf 'base-image: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

build=false
case "${1:-}" in
  "") ;;
  --build) build=true ;;
  -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
  *) die "unknown argument $1 (use --build or nothing)" ;;
esac

command -v docker >/dev/null || die "docker is not installed"
docker info >/dev/null 2>&1 || die "no Docker engine answers (start dockerd)"

if ! $build; then
  if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "$IMAGE is already there ($(docker image inspect --format '{{.Id}}' "$IMAGE"))"
    exit 0
  fi
  if docker pull "$IMAGE" >&2; then
    log "pulled $IMAGE"
    exit 0
  fi
  log "cannot pull $IMAGE: building it from $MIRROR with debootstrap"
fi

[[ "$(id -u)" == 0 ]] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"

rootfs="$(mktemp -d "${TMPDIR:-/tmp}/debian-rootfs.XXXXXX")"
trap 'rm -rf "$rootfs"' EXIT
start=$SECONDS
debootstrap --variant=minbase "$SUITE" "$rootfs" "$MIRROR" >&2 || die "debootstrap failed (see above)"

# The official image's apt sources (deb822), and its settings for a container: no docs, man pages or locales
# installed, no package cache kept, apt's indexes gzipped, no recommended packages pulled by autoremove.
rm -f "$rootfs/etc/apt/sources.list"
cat > "$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE ${SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: ${SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
cat > "$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat > "$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
printf 'Acquire::GzipIndexes "true";\nAcquire::CompressionTypes::Order:: "gz";\n' \
  > "$rootfs/etc/apt/apt.conf.d/docker-gzip-indexes"
printf 'Acquire::Languages "none";\n' > "$rootfs/etc/apt/apt.conf.d/docker-no-languages"
printf 'Apt::AutoRemove::SuggestsImportant "false";\n' > "$rootfs/etc/apt/apt.conf.d/docker-autoremove-suggests"
# What debootstrap leaves that no image should carry: package caches and lists, logs, the build host's name.
# (Packages already installed keep their docs: the excludes above apply from the next install.)
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log
: > "$rootfs/etc/hostname"
: > "$rootfs/etc/resolv.conf"

tar --numeric-owner -C "$rootfs" -c . \
  | docker import --change 'CMD ["bash"]' --message "debootstrap --variant=minbase $SUITE $MIRROR" - "$IMAGE" >&2
log "built $IMAGE from $MIRROR in $((SECONDS - start)) s: $(docker image inspect --format '{{.Size}}' "$IMAGE") bytes"
