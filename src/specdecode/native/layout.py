"""Choosing a float32 model's linear-layer layout by timing it: the fastest verification on this machine.

Speculative decoding feeds the target gamma + 1 rows per call. Which layout runs those fastest depends
on the CPU: on a 2-core AMD EPYC 'dual' verified 2 rows for 1.06 single rows, on a 2-core Xeon for
1.36, where plain weights ('none') took 1.06 (docs/benchmarks.md). 'dual' had the fastest single row
on both, so it stays the choice for one row; for more, `choose_packing` times 'dual' and 'none' on the
model itself, interleaved, and caches the result on disk per machine (CPU model, threads, torch
version, model shape, dtype, rows), so only the first load on a machine pays for it (about 3 s on
SmolLM2-135M, most of it oneDNN's packing).
'packed' is not a candidate: it runs several rows as 'dual' does and one row slower.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from specdecode.models.loading import cache_root
from specdecode.native.fast import current_packing, pack_linears
from specdecode.native.model import NativeTransformer
from specdecode.timing_cache import cpu_name, read_timing, timing_file, write_timing

__all__ = ["LayoutChoice", "CANDIDATES", "TIE", "choose_packing", "time_layouts", "pick", "layout_cache_dir"]

logger = logging.getLogger(__name__)

CANDIDATES = ("dual", "none")  # in order of preference where both T(rows) and T(1) tie
TIE = 0.03  # layouts whose T(rows) differ by less than this fraction tie; the faster single row breaks it
_CONTEXT = 32  # tokens in the cache before the timed passes
_REPS = 7
_VERSION = 1  # bump when what is timed or how the choice is made changes


@dataclass(frozen=True)
class LayoutChoice:
    """The layout chosen for `rows` rows per call, with the median seconds it was chosen on."""

    packing: str
    rows: int
    seconds: dict[str, dict[int, float]]  # {layout: {1: T(1), rows: T(rows)}}
    cached: bool = False  # read from the disk cache rather than timed now

    def to_dict(self) -> dict:
        """As JSON holds it: the row counts as strings."""
        seconds = {layout: {str(k): t for k, t in per_rows.items()} for layout, per_rows in self.seconds.items()}
        return {**asdict(self), "seconds": seconds}


def layout_cache_dir() -> Path:
    """Where timed choices are kept: <cache root>/layouts, one small JSON file per machine and model."""
    return cache_root() / "layouts"


def _key(model: NativeTransformer, rows: int) -> dict:
    """What the timing depends on: the machine, the threads, torch, the model's shape (not its values), rows."""
    return {
        "cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "config": model.config.to_dict(), "dtype": str(model.dtype), "rows": rows, "version": _VERSION,
    }


def _cache_file(key: dict) -> Path:
    return layout_cache_dir() / timing_file("layouts", key).name


def _read_cached(path: Path, key: dict) -> LayoutChoice | None:
    record = read_timing(path, key)
    if record is None:
        return None
    seconds = {layout: {int(k): t for k, t in per_rows.items()} for layout, per_rows in record["seconds"].items()}
    return LayoutChoice(record["packing"], key["rows"], seconds, cached=True)


def _write_cached(path: Path, key: dict, choice: LayoutChoice) -> None:
    write_timing(path, key, {"packing": choice.packing, "seconds": choice.to_dict()["seconds"]})


def pick(seconds: dict[str, dict[int, float]], rows: int) -> str:
    """The layout with the lowest T(rows); among those within TIE of it, the one with the lowest T(1)."""
    best = min(seconds[layout][rows] for layout in seconds)
    close = [layout for layout in seconds if seconds[layout][rows] <= best * (1 + TIE)]
    return min(close, key=lambda layout: (seconds[layout][1], CANDIDATES.index(layout)))


_LINEARS = ("qkv", "o", "gate_up", "down")


def _modules(model: NativeTransformer) -> dict[tuple, nn.Module]:
    """The modules a packing replaces, by (owner path, attribute)."""
    found = {(("layers", i), name): getattr(layer, name) for i, layer in enumerate(model.layers) for name in _LINEARS}
    found[((), "lm_head")] = model.lm_head
    found[((), "embed")] = model.embed  # a tied 'dual' model looks embeddings up in the head's plain copy
    return found


def _install(model: NativeTransformer, modules: dict[tuple, nn.Module]) -> None:
    for (owner, name), module in modules.items():
        setattr(model.layers[owner[1]] if owner else model, name, module)


@torch.inference_mode()
def time_layouts(model: NativeTransformer, rows: int, reps: int = _REPS) -> tuple[dict[str, dict[int, float]], dict]:
    """Median seconds of one forward of 1 and of `rows` rows after a short context, per layout in CANDIDATES.

    The model must be plain ('none'). Both layouts are built once and swapped in turn (the order
    alternates every repetition), so a noisy machine slows both alike. Returns the timings and the
    modules of each layout, for `_install`.
    """
    if current_packing(model) != "none":
        raise ValueError(f"time_layouts needs a plain model; this one is packed as {current_packing(model)!r}")
    context = min(_CONTEXT, model.config.max_position_embeddings - rows)
    if context < 1:
        raise ValueError(f"rows {rows} leave no room for a context in {model.config.max_position_embeddings} positions")
    plain = _modules(model)
    pack_linears(model, "dual")
    layouts = {"dual": _modules(model), "none": plain}
    cache = model.new_cache(context + rows)
    ids = torch.arange(context + rows, device=model.device) % model.config.vocab_size  # [P + rows]
    for layout in layouts.values():  # fill the context's keys and values (the same for both layouts)
        _install(model, layout)
        model(ids[:context], torch.arange(context, device=model.device), cache, last_only=True, end=context)
    times: dict[str, dict[int, list[float]]] = {name: {1: [], rows: []} for name in layouts}
    names = list(layouts)
    for rep in range(reps + 1):  # the first pass is untimed (allocations, oneDNN's first-call set-up)
        for name in (names if rep % 2 == 0 else names[::-1]):
            _install(model, layouts[name])
            for k in (1, rows):
                end = context + k
                start = time.perf_counter()
                model(ids[context:end], torch.arange(context, end, device=model.device), cache, end=end)
                if rep > 0:
                    times[name][k].append(time.perf_counter() - start)
    return {name: {k: statistics.median(v) for k, v in per_k.items()} for name, per_k in times.items()}, layouts


def choose_packing(model: NativeTransformer, rows: int) -> LayoutChoice:
    """Leave the plain float32 CPU model in the layout that runs `rows` rows per call fastest here; say which.

    The choice is read from the disk cache when this machine has timed this model shape before;
    otherwise both layouts are timed (`time_layouts`) and the result is cached.
    """
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 2:
        raise ValueError(f"rows must be an integer >= 2 (one row always takes 'dual'), got {rows!r}")
    key = _key(model, rows)
    path = _cache_file(key)
    choice = _read_cached(path, key)
    if choice is not None:
        if choice.packing != "none":
            pack_linears(model, choice.packing)
        return choice
    seconds, layouts = time_layouts(model, rows)
    choice = LayoutChoice(pick(seconds, rows), rows, seconds)
    _install(model, layouts[choice.packing])
    _write_cached(path, key, choice)
    logger.info("linear layers %r for %d rows per call: T(1), T(%d) in ms %s", choice.packing, rows, rows,
                {name: [round(1000 * t, 1) for t in per_rows.values()] for name, per_rows in seconds.items()})
    return choice
