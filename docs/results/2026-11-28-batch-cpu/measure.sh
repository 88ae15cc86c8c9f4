#!/usr/bin/env bash
# CPU seconds per photo by process of `python -m serving batch`, through Ray Data (--address local: what the command
# ran on one machine before) and by default (the policy's workers as a process pool, no Ray), on N photos and on a
# few (NSMALL: the start's fixed cost). Run from the repository root:
#   bash docs/results/2026-11-28-batch-cpu/measure.sh [WORK] [N] [NSMALL]
# WORK (default /tmp/batch-cpu) gets resnet18's export and the photos of 2026-11-27-batch/photos.py (the same mix);
# tables on stdout, each run's own output in WORK/m-PATH-N.{txt,log}.
set -euo pipefail
WORK=${1:-/tmp/batch-cpu}
COUNT=${2:-600}
SMALL=${3:-28}
PY=.venv/bin/python
HERE=docs/results/2026-11-28-batch-cpu
mkdir -p "$WORK"
if [ ! -f "$WORK/artifacts/manifest.json" ]; then
    $PY -m export resnet --arch resnet18 --weights random --out "$WORK/artifacts" --model-store "$WORK/store" \
        --formats onnx-traced > "$WORK/export.txt" 2>&1
fi
PYTHONPATH=. $PY docs/results/2026-11-27-batch/photos.py "$WORK" "$COUNT" vga:2,2mp:2,6mp:2,12mp:1 > /dev/null
mkdir -p "$WORK/few"
find "$WORK/few" -type l -delete
ls "$WORK/photos" | sort | head -"$SMALL" | while read -r name; do ln -s "$WORK/photos/$name" "$WORK/few/$name"; done
for n in "$COUNT" "$SMALL"; do
    source=$WORK/photos; [ "$n" = "$COUNT" ] || source=$WORK/few
    for path in ray local; do
        extra=(); [ $path = ray ] && extra=(--address local)
        rm -rf "$WORK/out-$path-$n"
        echo "== $(date -u +%H:%M:%S) $path $n; $(uptime | sed 's/.*load/load/')" >&2
        $PY $HERE/cpu_by_process.py "$n" "$path-$n" -- $PY -m serving batch "$WORK/artifacts" "$source" \
            --out "$WORK/out-$path-$n" "${extra[@]}" > "$WORK/m-$path-$n.txt" 2> "$WORK/m-$path-$n.log"
        sed -n '/^'"$path-$n"':/,$p' "$WORK/m-$path-$n.txt"
    done
done
