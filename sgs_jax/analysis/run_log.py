"""Read one run's metrics back: from `metrics.jsonl` or from TensorBoard event files.

Both paths give the same RunLog (TensorBoard stores scalars as float32, so values read
from it carry float32 rounding, a relative 6e-8). A step written twice (a run resumed
from an earlier checkpoint) keeps its later write. A JSONL line that cannot be read (torn
by preemption, glued to a resumed write, bytes that are not UTF-8) is skipped with one
logged warning naming the file and line number, and counted, never fatal.

`read_run_config` reads the run's recorded `config.json` (None when absent or unreadable).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from collections.abc import Mapping

import numpy as np
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

from sgs_jax.metrics import JSONL_NAME, histogram_buckets

SOURCES = ("auto", "jsonl", "tensorboard")
EVENT_FILE_GLOB = "events.out.tfevents.*"
CONFIG_NAME = "config.json"  # the resolved config a run records (sgs_jax.config.save_resolved)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, eq=False)
class Series:
    """One scalar over time: steps [n] (int64, increasing) and values [n] (float64)."""

    steps: np.ndarray
    values: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class HistogramSnapshot:
    """One histogram at one step: bucket upper limits [m] and counts [m]
    (bucket i holds values in (limits[i-1], limits[i]]; see metrics.histogram_buckets)."""

    step: int
    limits: np.ndarray
    counts: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class RunLog:
    """All metrics of one run. source: "jsonl" or "tensorboard". skipped_lines: 1-based
    numbers of the JSONL lines that could not be read (torn, malformed or not UTF-8)."""

    name: str
    source: str
    scalars: Mapping[str, Series]
    histograms: Mapping[str, tuple[HistogramSnapshot, ...]]
    skipped_lines: tuple[int, ...] = ()

    def paired(self, x_name: str, y_name: str) -> tuple[np.ndarray, np.ndarray]:
        """Values of two scalars at the steps where both were written, in step order;
        two empty arrays when either is missing."""
        if x_name not in self.scalars or y_name not in self.scalars:
            return np.zeros(0), np.zeros(0)
        x, y = self.scalars[x_name], self.scalars[y_name]
        _, ix, iy = np.intersect1d(x.steps, y.steps, return_indices=True)
        return x.values[ix], y.values[iy]


def _collect(scalar_points: dict, histogram_points: dict) -> tuple[dict, dict]:
    """Turn {name: {step: value}} maps into step-sorted Series and snapshot tuples."""
    scalars = {}
    for name, by_step in scalar_points.items():
        steps = np.array(sorted(by_step), dtype=np.int64)
        scalars[name] = Series(steps, np.array([by_step[s] for s in steps], dtype=np.float64))
    histograms = {}
    for name, by_step in histogram_points.items():
        histograms[name] = tuple(HistogramSnapshot(int(s), *by_step[s]) for s in sorted(by_step))
    return scalars, histograms


def _read_jsonl(path: pathlib.Path) -> tuple[dict, dict, tuple[int, ...]]:
    """Scalar and histogram points of a metrics.jsonl, and the numbers of the lines skipped.
    Lines are decoded one by one, so a bad byte costs its line only."""
    scalar_points: dict = {}
    histogram_points: dict = {}
    skipped = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
                step = int(record["step"])
                if "scalars" in record:
                    points = {str(name): float(value) for name, value in record["scalars"].items()}
                    for name, value in points.items():
                        scalar_points.setdefault(name, {})[step] = value
                else:
                    buckets = histogram_buckets(np.asarray(record["values"], dtype=np.float64))
                    histogram_points.setdefault(str(record["histogram"]), {})[step] = buckets
            except (ValueError, KeyError, TypeError, AttributeError) as err:  # UnicodeDecodeError is a ValueError
                log.warning("%s line %d: skipped, not a readable metrics record (%s)", path, number,
                            type(err).__name__)
                skipped.append(number)
    return scalar_points, histogram_points, tuple(skipped)


def _event_files_in_write_order(run_dir: pathlib.Path) -> list[pathlib.Path]:
    """Event files ordered by the wall time of their first record (a resumed run's
    file comes after the original's), then by name."""
    def first_wall_time(path: pathlib.Path) -> float:
        for event in LegacyEventFileLoader(str(path)).Load():
            return event.wall_time
        return float("inf")

    return sorted(run_dir.glob(EVENT_FILE_GLOB), key=lambda p: (first_wall_time(p), p.name))


def _read_events(run_dir: pathlib.Path) -> tuple[dict, dict, int]:
    scalar_points: dict = {}
    histogram_points: dict = {}
    for path in _event_files_in_write_order(run_dir):
        for event in LegacyEventFileLoader(str(path)).Load():
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalar_points.setdefault(value.tag, {})[int(event.step)] = float(value.simple_value)
                elif value.HasField("histo"):
                    limits = np.asarray(value.histo.bucket_limit, dtype=np.float64)
                    counts = np.asarray(value.histo.bucket, dtype=np.float64)
                    histogram_points.setdefault(value.tag, {})[int(event.step)] = (limits, counts)
    return scalar_points, histogram_points, ()


def load_run(run_dir: str | pathlib.Path, source: str = "auto", name: str | None = None) -> RunLog:
    """Read a run folder written by MetricsWriter.

    source: "jsonl" (metrics.jsonl), "tensorboard" (event files) or "auto" (the JSONL
    copy when present, else the event files). Raises FileNotFoundError when the folder
    holds no metrics of the requested kind, ValueError for an unknown source.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder {run_dir} does not exist")
    jsonl = run_dir / JSONL_NAME
    if source == "auto":
        source = "jsonl" if jsonl.exists() else "tensorboard"
    if source == "jsonl":
        if not jsonl.exists():
            raise FileNotFoundError(f"no {JSONL_NAME} in {run_dir}")
        scalar_points, histogram_points, skipped = _read_jsonl(jsonl)
    else:
        if not any(run_dir.glob(EVENT_FILE_GLOB)):
            raise FileNotFoundError(f"no TensorBoard event files ({EVENT_FILE_GLOB}) in {run_dir}")
        scalar_points, histogram_points, skipped = _read_events(run_dir)
    scalars, histograms = _collect(scalar_points, histogram_points)
    return RunLog(name=name or run_dir.name, source=source, scalars=scalars,
                  histograms=histograms, skipped_lines=skipped)


def has_metrics(run_dir: str | pathlib.Path) -> bool:
    """Whether a folder holds a run's metrics (metrics.jsonl or TensorBoard event files)."""
    run_dir = pathlib.Path(run_dir)
    return (run_dir / JSONL_NAME).is_file() or any(run_dir.glob(EVENT_FILE_GLOB))


def read_run_config(run_dir: str | pathlib.Path) -> dict | None:
    """The run's recorded config.json as a dict; None when it is absent, and None with one
    logged warning when it cannot be read."""
    path = pathlib.Path(run_dir) / CONFIG_NAME
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as err:
        log.warning("%s: unreadable (%s); the run is labelled by its folder name", path, err)
        return None
    if not isinstance(config, dict):
        log.warning("%s: not a JSON object; the run is labelled by its folder name", path)
        return None
    return config
