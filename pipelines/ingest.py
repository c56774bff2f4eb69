"""Ingest: read a CSV or Parquet file (long or wide), validate it, fingerprint it."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forecaster.data import load_frame
from forecaster.errors import SeriesTooShortError
from forecaster.time_axis import is_integer_axis, time_label, time_point
from forecaster.validation import ValidatedFrame, validate_long_frame

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestResult:
    """Validated data and what identifies it."""

    frame: pd.DataFrame  # unique_id, ds, y (+ covariates), grouped by series, time increasing
    freq: str  # pandas offset alias, e.g. "h"
    n_series: int
    fingerprint: str  # "sha256:<hex>" of the validated content; same data -> same value
    start: pd.Timestamp | int  # earliest timestamp (an int for integer ds)
    end: pd.Timestamp | int  # latest timestamp
    source: str  # the file it came from, or "<frame>"
    # Series too short for the run's split, left out of `frame` (`ingest(leave_out_short=True)`).
    left_out: tuple[str, ...] = ()

    def as_params(self) -> dict[str, Any]:
        return {
            "data.source": self.source,
            "data.fingerprint": self.fingerprint,
            "data.freq": self.freq,
            "data.n_series": self.n_series,
            "data.n_series_left_out": len(self.left_out),
            "data.n_rows": len(self.frame),
            "data.start": time_label(self.start),
            "data.end": time_label(self.end),
        }


def ingest(
    source: str | Path | pd.DataFrame,
    *,
    covariates: tuple[str, ...] = (),
    min_length: int = 1,
    time_column: str | None = None,
    requirement: str = "",
    leave_out_short: bool = False,
) -> IngestResult:
    """Load ``source`` and check it with the core's validation rules.

    Args:
        source: a CSV/Parquet path (long, or wide with a time column) or a long frame.
        covariates: covariate columns the model needs.
        min_length: the fewest observed points a series may have. NaN targets and missing
            timestamps are kept as missing values (NaN rows), which the model masks.
        time_column: time column of a wide file (default "date").
        requirement: what ``min_length`` is made of, added to a too-short error.
        leave_out_short: series with fewer than ``min_length`` observed points are left out
            of the result, with a warning, instead of refusing the data (new products or
            sensors in a catalogue; a global model still forecasts them). Refused when no
            series is long enough.

    Raises:
        ForecasterInputError: any problem with the file or its content, naming it.
    """
    if isinstance(source, pd.DataFrame):
        df, name = source, "<frame>"
    else:
        # Absolute: a relative path names nothing to whoever reads the run later.
        df, name = load_frame(source, time_column=time_column), str(Path(source).resolve())
    try:
        validated = validate_long_frame(
            df,
            covariates=covariates,
            min_length=1 if leave_out_short else min_length,
            allow_missing=True,
        )
        left_out = _short_series(validated, min_length) if leave_out_short else ()
        if len(left_out) == validated.n_series:  # nothing left: refused, as without the option
            validate_long_frame(
                df, covariates=covariates, min_length=min_length, allow_missing=True
            )
    except SeriesTooShortError as exc:
        if not requirement:
            raise
        raise SeriesTooShortError(
            f"{exc.message}; {requirement}", series_id=exc.series_id, field=exc.field
        ) from None
    frame = validated.frame
    if is_integer_axis(validated.freq):  # steps stay steps, as the model is fitted on them
        frame = frame.assign(ds=frame["ds"].to_numpy().view(np.int64))
    if left_out:
        frame = frame[~frame["unique_id"].isin(left_out)].reset_index(drop=True)
        logger.warning(
            "%s: %d of %d series have fewer than %d observed points (%s), the first %r; they are "
            "left out of this run's training and evaluation, and the model still forecasts them",
            name,
            len(left_out),
            validated.n_series,
            min_length,
            requirement or "the run's split",
            left_out[0],
        )
    if not isinstance(source, pd.DataFrame):
        _warn_if_cut_short(Path(source))
    _warn_of_early_ends(validated, name)
    ignored = [str(c) for c in df.columns if c not in frame.columns and c != "y"]
    if ignored:
        logger.warning(
            "%s: ignoring column(s) %s; only unique_id, ds, y and the configured covariates %s "
            "are used",
            name,
            ignored,
            list(covariates),
        )
    result = IngestResult(
        frame=frame,
        freq=validated.freq,
        n_series=validated.n_series - len(left_out),
        fingerprint=fingerprint(frame),
        start=time_point(frame["ds"].min()),
        end=time_point(frame["ds"].max()),
        source=name,
        left_out=left_out,
    )
    logger.info(
        "ingested %s: %d series, %d rows, freq %s, %s .. %s, %s",
        name,
        result.n_series,
        len(frame),
        result.freq,
        result.start,
        result.end,
        result.fingerprint[:19],
    )
    return result


def _short_series(validated: ValidatedFrame, min_length: int) -> tuple[str, ...]:
    """The ids of the series with fewer than `min_length` observed points."""
    observed = ~np.isnan(validated.columns["y"])
    counts = np.add.reduceat(observed, validated.offsets[:-1]) if observed.size else observed
    return tuple(
        sid for sid, count in zip(validated.series_ids, counts, strict=True) if count < min_length
    )


def _warn_if_cut_short(path: Path) -> None:
    """A CSV written by pandas, a database export or a feed ends its last line; one that does
    not may have been read while it was being written (its last value cut: 14.147 read as
    14.0), which validation cannot see."""
    if path.suffix.lower() != ".csv" or not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        f.seek(-1, 2)
        last = f.read(1)
    if last not in (b"\n", b"\r"):
        logger.warning(
            "%s: the last line has no line end; if the file was still being written, its last "
            "row is cut short",
            path,
        )


def _warn_of_early_ends(validated: ValidatedFrame, name: str) -> None:
    """Series that end before the data does: series that stopped, or a feed cut short (a file
    read half-written loses the series at its end). Each is forecast from its own end."""
    ends = validated.columns["ds"][validated.offsets[1:] - 1]
    early = ends < ends.max()
    if early.any():
        k = int(np.argmin(ends))
        logger.warning(
            "%s: %d of %d series end before the data's last timestamp %s (the earliest, %r, at "
            "%s); each is forecast from its own end",
            name,
            int(early.sum()),
            len(ends),
            pd.Timestamp(ends.max()),
            str(validated.series_ids[k]),
            pd.Timestamp(ends[k]),
        )


def fingerprint(frame: pd.DataFrame) -> str:
    """Content hash of a validated frame (column names, values, row order)."""
    digest = hashlib.sha256()
    digest.update("\x1f".join(map(str, frame.columns)).encode())
    digest.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    return f"sha256:{digest.hexdigest()}"
