#!/usr/bin/env bash
# Two cuts measured on one quiet machine, Lite0 (trained), the code before (BEFORE, a worktree of 07d465e with the
# same .venv) and after (this checkout):
#   OUT=DIR BEFORE=WORKTREE docs/results/2026-11-29-gate-and-export-choice/run.sh
# 1. a first start on the machine that exported: the form-choice cache emptied, Lite0 exported by this checkout
#    (which keeps its timing of the forms), then `measure start --warm` on each engine (its first run reads what the
#    export kept), beside `measure start` cold (the choice timed afresh, as on a new machine);
# 2. Ray's load beside (the 2026-11-29 beside.sh, three rollouts and rollbacks) and Ray's start (start.sh), before
#    and after.
set -uo pipefail
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
AFTER=$(cd "$HERE/../../.." && pwd)
cd "$AFTER"
grep -o 'avx512[a-z_]*\|avx2\|amx[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/cpu.txt"
rm -rf "${XDG_CACHE_HOME:-$HOME/.cache}/vision-export/form-choices"
store="$OUT/store"
.venv/bin/python -m export efficientnet --arch lite0 --out "$OUT/export" --model-store "$store" > "$OUT/export.log" 2>&1
ls "${XDG_CACHE_HOME:-$HOME/.cache}/vision-export/form-choices" > "$OUT/kept-after-export.txt"
for engine in kserve torchserve ray; do
  uptime >> "$OUT/load-start.txt"
  .venv/bin/python -m measure start --store "$store" --engine "$engine" --port 18200 --runs 2 --warm \
    --out "$OUT/after-export-$engine" > "$OUT/after-export-$engine.log" 2>&1
  .venv/bin/python -m measure start --store "$store" --engine "$engine" --port 18200 --runs 1 \
    --out "$OUT/cold-$engine" > "$OUT/cold-$engine.log" 2>&1
done
.venv/bin/python -c "
from pathlib import Path
from contract.records import Manifest
from export.package.archive import build_archive
build_archive(Path('$OUT/export'), Manifest.read(Path('$OUT/export')), Path('$store'))"
STORE="$store" OUT="$OUT/beside" BEFORE="$BEFORE" ENGINES=ray "$HERE/../2026-11-29-beside-and-switch/beside.sh"
STORE="$store" OUT="$OUT/start" BEFORE="$BEFORE" "$HERE/../2026-11-29-beside-and-switch/start.sh"
