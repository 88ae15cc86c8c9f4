#!/bin/bash
# Every figure of this folder, in one quiet window (2-core AMD EPYC Zen 4, avx512_bf16, no AMX, 2026-11-26).
set -ex
P=.venv/bin/python
$P -m export detection --arch fasterrcnn_mobilenet_v3_large_320_fpn --weights random --out /tmp/m/fasterrcnn_mobilenet_v3_large_320_fpn
$P -m export segmentation --arch lraspp_mobilenet_v3_large --weights random --out /tmp/m/lraspp
$P -m export detection --arch mtcnn --out /tmp/m/mtcnn --model-store /tmp/m/mtcnn-store
$P -m examples.photo_sizes /tmp/m/bodies && mkdir -p /tmp/m/b3 && cp /tmp/m/bodies/{vga.jpg,2mp.jpg,12mp-sideways.jpg} /tmp/m/b3/
$P docs/results/2026-11-26-detectors-served/face_photos.py /tmp/m/faces
$P -m measure bench --export-dir /tmp/m/fasterrcnn_mobilenet_v3_large_320_fpn --images /tmp/m/b3 --concurrency 1,2,4 --duration 10 --warmup 5 --out /tmp/m/R/frcnn
$P -m measure bench --export-dir /tmp/m/mtcnn --images /tmp/m/faces --concurrency 1,2,4 --duration 10 --warmup 5 --out /tmp/m/R/mtcnn
$P -m measure bench --export-dir /tmp/m/lraspp --images /tmp/m/b3 --configurations default,form:scripted,kserve,ray --concurrency 1,2,4 --duration 10 --warmup 5 --out /tmp/m/R/lraspp
# Before/after of this session's two speed changes, each "before" from a git worktree at the commit before it:
#   MTCNN's NCHW networks: in a worktree at 2a57d7a, python -m export detection --arch mtcnn --out /tmp/mt/out; then, here,
#     python -m measure pipeline --export-dir /tmp/mt/out --artifact scripted --images /tmp/m/faces   (after: --export-dir /tmp/m/mtcnn)
#   LR-ASPP's encode: in a worktree at 130a695, python -m measure pipeline --export-dir /tmp/m/lraspp --images /tmp/m/b3 (after: here)
