#!/usr/bin/env bash
# Pin every package of the image: write docker/constraints.txt from a built image's venv (pip freeze), so that the
# next build resolves to the same versions (pip --constraint; the Dockerfile's own pins stay where they are).
#
#   make docker-build && docker/lock.sh [IMAGE]      # IMAGE: vision-export-torchserve
#
# Build with EXTRAS=serving,ray first to pin the ray extra's packages too. Review the diff before committing it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${1:-vision-export-torchserve}"
DOCKER="$("$ROOT/docker/build.sh" --print-docker)"
frozen="$("$DOCKER" run --rm --entrypoint /opt/venv/bin/pip "$IMAGE" freeze --disable-pip-version-check)"
[[ -n "$frozen" ]] || { echo "lock: pip freeze in $IMAGE printed nothing" >&2; exit 1; }
{
  printf '# Every package the image installs, at the version a build resolved: written by docker/lock.sh from %s\n' "$IMAGE"
  printf '# (%s). pip reads it as --constraint: it pins versions, it installs nothing by itself.\n' \
    "$("$DOCKER" image inspect --format '{{.Created}}' "$IMAGE")"
  printf '%s\n' "$frozen" | LC_ALL=C sort -f
} > "$ROOT/docker/constraints.txt.tmp"
mv "$ROOT/docker/constraints.txt.tmp" "$ROOT/docker/constraints.txt"
echo "lock: $(grep -vc '^#' "$ROOT/docker/constraints.txt") packages pinned in docker/constraints.txt" >&2
