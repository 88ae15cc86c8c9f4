#!/usr/bin/env bash
# Build the serving image (docker/Dockerfile) as compose.yaml names it, from a fresh clone: `make docker-build`.
#
#   docker/build.sh [--ca-bundle FILE] [--tag NAME] [--print-docker]
#
# 1. The base (debian:bookworm-slim): used when present, else pulled, else built from Debian's archive with
#    debootstrap under the same name (docker/base-image.sh); only the last needs root and debootstrap.
# 2. The build with BuildKit (the Dockerfile's RUN --mount: pip's download cache and the CA secret). The docker CLI
#    used is the first on PATH that can: one with the buildx plugin, or Docker < 23's CLI, whose BuildKit is built
#    in (Debian's docker.io). `--print-docker` prints that CLI and exits (the tests run docker-compose with it).
# 3. --ca-bundle FILE (or CA_BUNDLE=FILE): a PEM bundle pip verifies PyPI with, for a network that re-signs TLS (the
#    host's /etc/ssl/certs/ca-certificates.crt there). Given as the build secret `ca`: mounted for the install only
#    and kept by no layer.
# Build arguments come from the environment as compose passes them: APP_UID (default 1000), EXTRAS (serving).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TAG="${IMAGE:-vision-export-torchserve}"
CA="${CA_BUNDLE:-}"
print_docker=false

log() { printf 'docker-build: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

while (($#)); do
  case "$1" in
    --ca-bundle) [[ $# -ge 2 ]] || die "--ca-bundle needs a file"; CA="$2"; shift 2 ;;
    --tag) [[ $# -ge 2 ]] || die "--tag needs a name"; TAG="$2"; shift 2 ;;
    --print-docker) print_docker=true; shift ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

# The first docker CLI on PATH that builds with BuildKit: "buildx" (docker buildx build --load) or "builtin"
# (DOCKER_BUILDKIT=1 docker build). Docker >= 23's CLI without the buildx plugin refuses DOCKER_BUILDKIT=1
# ("BuildKit is enabled but the buildx component is missing") and its legacy builder has no RUN --mount.
find_docker() {
  local candidate version
  while read -r candidate; do
    [[ -x "$candidate" ]] || continue
    if "$candidate" buildx version >/dev/null 2>&1; then
      printf '%s buildx\n' "$candidate"; return 0
    fi
    version="$("$candidate" version --format '{{.Client.Version}}' 2>/dev/null || true)"
    if [[ "$version" =~ ^([0-9]+)\. ]] && ((BASH_REMATCH[1] >= 18 && BASH_REMATCH[1] < 23)); then
      printf '%s builtin\n' "$candidate"; return 0
    fi
  done < <(type -ap docker | awk '!seen[$0]++')
  return 1
}

read -r DOCKER MODE < <(find_docker) \
  || die "no docker CLI here builds with BuildKit: install the buildx plugin, or Debian's docker.io (its CLI has it built in)"
if $print_docker; then
  printf '%s\n' "$DOCKER"
  exit 0
fi
"$DOCKER" info >/dev/null 2>&1 || die "no Docker engine answers $DOCKER (start dockerd)"

secret=()
if [[ -n "$CA" ]]; then
  [[ -f "$CA" && -r "$CA" ]] || die "--ca-bundle $CA is not a readable file"
  grep -q -- '-----BEGIN CERTIFICATE-----' "$CA" || die "--ca-bundle $CA has no PEM certificate"
  secret=(--secret "id=ca,src=$CA")
fi

base="$(sed -n 's/^ARG BASE_IMAGE=//p' "$ROOT/docker/Dockerfile")"
[[ -n "$base" ]] || die "docker/Dockerfile declares no ARG BASE_IMAGE=..."
PATH="$(dirname "$DOCKER"):$PATH" BASE_IMAGE="$base" "$ROOT/docker/base-image.sh"

# The arguments compose.yaml passes (APP_UID), and EXTRAS only when set: the same build as `docker compose build`.
args=(--file "$ROOT/docker/Dockerfile" --tag "$TAG" --build-arg "APP_UID=${APP_UID:-1000}"
      ${EXTRAS:+--build-arg "EXTRAS=$EXTRAS"} "${secret[@]}" --progress=plain "$ROOT")
previous="$("$DOCKER" image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)"
log "building $TAG with $DOCKER ($MODE BuildKit)${CA:+, CA bundle $CA as the build secret ca}"
start=$SECONDS
if [[ "$MODE" == buildx ]]; then
  "$DOCKER" buildx build --load "${args[@]}"
else
  DOCKER_BUILDKIT=1 "$DOCKER" build "${args[@]}"
fi
log "built $TAG in $((SECONDS - start)) s: $("$DOCKER" image inspect --format '{{.Id}} {{.Size}} bytes' "$TAG")"
# The image this build replaced is left without a name (7 GB): removed, unless a container still uses it.
current="$("$DOCKER" image inspect --format '{{.Id}}' "$TAG")"
if [[ -n "$previous" && "$previous" != "$current" ]] \
   && [[ -z "$("$DOCKER" image inspect --format '{{join .RepoTags ","}}' "$previous" 2>/dev/null)" ]]; then
  if "$DOCKER" image rm "$previous" >/dev/null 2>&1; then
    log "removed the image it replaced ($previous)"
  else
    log "kept the image it replaced ($previous): a container uses it"
  fi
fi
