"""What model-config.yaml's `handler:` section carries (the serving knobs an archive pins), and the archive's labels
file. Standard library only: the archive ships it with the rest of contract/."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from contract.records import ContractError, _from_dict, _plain

TORCHSERVE_KEYS = ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout")


@dataclass(frozen=True)
class HandlerConfig:
    """model-config.yaml's `handler:` section. Which artifact is served is not here: the manifest says."""

    topk: int = 5
    fp16: bool = False  # TorchScript on a GPU under fp16 autocast
    threads: int | None = None  # pinned CPU threads per worker; None: the serving machine decides
    simulate_hang_s: float = 0.0  # tests of TorchServe's response timeout only
    decode: str | None = None  # "exact": decode every pixel even where the export's decode check allows draft

    def __post_init__(self) -> None:
        if self.decode not in (None, "exact"):
            raise ContractError(f"handler.decode may only be \"exact\" (decode every pixel), got {self.decode!r}: "
                                "draft decoding is allowed by the export's decode check, never by a setting")
        topk = _number(self.topk, int, "topk")
        threads = None if self.threads is None else _number(self.threads, int, "threads")  # None: not pinned
        hang = _number(self.simulate_hang_s, float, "simulate_hang_s")
        if not 1 <= topk <= 100:
            raise ContractError(f"handler.topk must be from 1 to 100, got {self.topk}")
        if threads is not None and threads < 1:
            raise ContractError(f"handler.threads must be at least 1 (or absent), got {self.threads}")
        if hang < 0:
            raise ContractError(f"handler.simulate_hang_s must be >= 0, got {self.simulate_hang_s}")
        object.__setattr__(self, "topk", topk)
        object.__setattr__(self, "threads", threads)
        object.__setattr__(self, "simulate_hang_s", hang)
        if not isinstance(self.fp16, bool):
            raise ContractError(f"handler.fp16 must be true or false, got {self.fp16!r}")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "HandlerConfig":
        return _from_dict(cls, dict(data or {}), "model-config.yaml handler")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in _plain(self).items() if v is not None}


_Number = TypeVar("_Number", int, float)


def _number(value: Any, kind: Callable[[Any], _Number], name: str) -> _Number:
    """`value` as an int or a float, or the ContractError naming the setting (None included: only threads may be
    absent, and its caller keeps None)."""
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ContractError(f"handler.{name} must be a number, got {value!r}") from None


def read_labels(path: str | Path) -> dict[int, str]:
    """index_to_name.json: {"0": "tench", ...} -> {0: "tench", ...}."""
    try:
        data = json.loads(Path(path).read_text())
        return {int(k): str(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError) as error:
        raise ContractError(f"labels file {path} cannot be read ({error}); rebuild with `python -m export`") from None
