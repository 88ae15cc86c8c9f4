#!/usr/bin/env bash
# Interleaved before/after serving benchmark of two checkouts on the same export.
#
#   bash examples/bench_pairs.sh BEFORE_CHECKOUT AFTER_CHECKOUT EXPORT_DIR OUT_DIR [CONFIGURATIONS] [ROUNDS] [IMAGE]
#
# Each checkout serves EXPORT_DIR with its own code (the archive ships runtime/ and handlers/; the benchmark and
# its servers run from the checkout: cd there, PYTHONPATH=the checkout), one `python -m measure bench` per row:
#
#   python -m measure bench --export-dir EXPORT_DIR --images IMAGE --duration 15 --concurrency 8 \
#       --configurations CONFIGURATIONS --inprocess none --pipeline none --out OUT_DIR/LABEL
#
# ROUNDS rounds, taking turns so that a drift of the machine falls on both sides: odd rounds before then after,
# even rounds after then before. LABEL is before-ROUND or after-ROUND; each row's output is OUT_DIR/LABEL.log, and
# its summary lines (one per configuration and concurrency) go to the screen and to OUT_DIR/pairs.log under a
# "== LABEL time load" header (the 1-minute load average as the row starts). Compare rows of the same run only.
#
#   CONFIGURATIONS  comma-separated, as measure bench takes them (default default,kserve)
#   ROUNDS          default 2
#   IMAGE           the body sent (default AFTER_CHECKOUT/examples/cat.jpg; the same file for both checkouts)
#
# Environment: PYTHON (default this repository's .venv/bin/python, else python3: one interpreter and its packages
# for both checkouts), DURATION (15), CONCURRENCY (8), INPROCESS (none, or a bench.json from
# `python -m measure inprocess` for the served/in-process ratios). The checkout before a change can be made with
# `git worktree add /tmp/before COMMIT`. The exit status is the number of rows whose bench failed (at most 255).
#
# Results made with it: docs/results/2026-11-25-serving-overhead-zen5/, docs/results/2026-11-25-uint8-resize-zen5/.
set -u

usage() {
  [ $# -gt 0 ] && echo "$*" >&2
  echo "usage: bash $0 BEFORE_CHECKOUT AFTER_CHECKOUT EXPORT_DIR OUT_DIR [CONFIGURATIONS] [ROUNDS] [IMAGE]" >&2
  echo "  (what it runs, the defaults and the environment: the comment at the top of $0)" >&2
  exit 2
}

[ $# -ge 4 ] && [ $# -le 7 ] || usage
here="$(cd "$(dirname "$0")/.." && pwd)"
folder() { [ -d "$1" ] || usage "no folder $1"; (cd "$1" && pwd); }
before="$(folder "$1")" || exit 2
after="$(folder "$2")" || exit 2
export_dir="$(folder "$3")" || exit 2
configurations="${5:-default,kserve}"
rounds="${6:-2}"
case "$rounds" in ''|*[!0-9]*|0) usage "ROUNDS must be a whole number, 1 or more";; esac
image="${7:-$after/examples/cat.jpg}"
[ -f "$image" ] || usage "no image $image"
image="$(folder "$(dirname "$image")")/$(basename "$image")"
mkdir -p "$4" || exit 2
out="$(folder "$4")" || exit 2
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$here/.venv/bin/python" ]; then PYTHON="$here/.venv/bin/python"; else PYTHON=python3; fi
fi

failed=0
row() {  # $1 before|after, $2 round
  local label="$1-$2" checkout
  if [ "$1" = before ]; then checkout="$before"; else checkout="$after"; fi
  echo "== $label $(date +%T) load $(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo ?)" | tee -a "$out/pairs.log"
  (cd "$checkout" && PYTHONPATH="$checkout" "$PYTHON" -m measure bench --export-dir "$export_dir" --images "$image" \
      --duration "${DURATION:-15}" --concurrency "${CONCURRENCY:-8}" --configurations "$configurations" \
      --inprocess "${INPROCESS:-none}" --pipeline none --out "$out/$label") > "$out/$label.log" 2>&1
  local status=$?
  grep -E "^  [^ ]+ +[^ ]+ +c=[0-9]+ " "$out/$label.log" | tee -a "$out/pairs.log"
  if [ $status -ne 0 ]; then
    echo "   $label: exit $status (see $out/$label.log)" | tee -a "$out/pairs.log"
    failed=$((failed + 1))
  fi
}

for round in $(seq "$rounds"); do
  if [ $((round % 2)) -eq 1 ]; then row before "$round"; row after "$round"
  else row after "$round"; row before "$round"; fi
done
exit $((failed > 255 ? 255 : failed))
