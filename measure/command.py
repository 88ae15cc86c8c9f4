"""What every measurement command shares: its options, the archive it measures, a TorchServe on free
loopback ports whose run folder is inside --out, and SIGTERM treated as Ctrl-C so a stopped command stops its
TorchServe too."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from contract.errors import VisionExportError
from contract.files import atomic_write_text
from serving.processes import sigterm_interrupts
from serving.settings import EXAMPLE_IMAGE, archives_in
from serving.torchserve.config import ServerSettings, on_free_ports

INTERRUPTED = "interrupted; TorchServe stopped"


class MeasureError(VisionExportError):
    """A measurement command cannot run as asked; the message says what to give instead."""


def write_tables(out: Path, stem: str, markdown: str, context: dict, rows: list) -> None:
    """OUT/STEM.md and OUT/STEM.json ({"context", "rows"}), each written whole; the table is printed."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{stem}.md", markdown)
    atomic_write_text(out / f"{stem}.json", json.dumps({"context": context, "rows": rows}, indent=2) + "\n")
    print(markdown + f"\nwrote {out}/{stem}.md, {stem}.json")


def load_command_parser(command: str, description: str, out: str) -> argparse.ArgumentParser:
    """`python -m serving COMMAND`'s parser with the options every load command shares (soak, faults)."""
    parser = argparse.ArgumentParser(prog=f"python -m serving {command}", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    load_command_options(parser, out)
    return parser


def load_command_options(parser, out: str) -> None:
    """The options every load command against a local TorchServe shares."""
    parser.add_argument("--model-store", type=Path, default=Path("model-store"))
    parser.add_argument("--model", default=None,
                        help="the archive NAME.mar to serve (default: the store's only archive)")
    parser.add_argument("--image", type=Path, default=EXAMPLE_IMAGE)
    parser.add_argument("--token-auth", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(out))


def archive_name(model_store: Path, model: str | None) -> str:
    """The model to measure: --model, or the only archive in the store (several: the user chooses)."""
    names = archives_in(model_store)  # NAME.vN.mar are NAME's kept versions
    if model is not None:
        if model not in names:
            raise MeasureError(f"{model_store}/{model}.mar not found (the store holds: {', '.join(names) or 'nothing'}); "
                               "export the model with --model-store, or pass --model one of those")
        return model
    if len(names) != 1:
        raise MeasureError(f"{model_store} holds {', '.join(f'{n}.mar' for n in names) or 'no archive'}: "
                           + ("pass --model NAME to choose one" if names else "run `python -m export ...` first"))
    return names[0]


def load_command_settings(args) -> ServerSettings:
    """A server of the chosen archive on free loopback ports whose run folder is inside the command's --out."""
    name = archive_name(args.model_store, args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = on_free_ports(args.model_store, args.out / "run")
    settings.model_name = name
    settings.token_auth = args.token_auth
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    return settings


def run_load_command(body) -> int:
    """run_command with SIGTERM treated as Ctrl-C, so a stopped command stops its TorchServe too."""
    from contract.cli import run_command
    sigterm_interrupts()  # so `timeout`, CI cancellation or kill stop TorchServe on the way out
    return run_command(body, interrupted=INTERRUPTED)
