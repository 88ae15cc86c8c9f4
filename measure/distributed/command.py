"""What the Ray measurement commands share (ray-two-node, ray-autoscale): OUT and the archive to serve as their
options, the one model they measure, Ray's usage reporting off."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from measure.command import archive_name


def ray_command_parser(command: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m measure {command}", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--model-store", type=Path, default=Path("model-store"))
    parser.add_argument("--model", default=None, help="NAME of NAME.mar (default: the store's only archive)")
    return parser


def measured_model(args) -> str:
    """--model, or the store's only archive; Ray told not to report usage (no internet, nothing to send)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return archive_name(args.model_store, args.model)
