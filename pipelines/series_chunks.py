"""Whole series from a long table read in row batches, for scoring files of any size.

Batch scoring (`pipelines.predict`) and the service's batch jobs both read a long file in row
batches and forecast it a bounded number of whole series at a time; this is their one way of
regrouping the batches into such chunks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd

from forecaster.columns import ID, TIME
from forecaster.errors import SeriesNotContiguousError


def whole_series_chunks(
    batches: Iterable[pd.DataFrame], chunk_series: int
) -> Iterator[pd.DataFrame]:
    """Regroup row batches of a long table whose rows are grouped by series into frames of
    `chunk_series` whole series each (the last may hold fewer), rows in input order.

    A series may run on from one batch into the next, so the series a batch ends in is held
    back until another id follows. Memory: one chunk plus one batch, and a hash per series
    already passed. Chunk k is the same on every pass over the same batches, which is what
    lets a resumed batch job skip the chunks it has written.

    Raises:
        SeriesNotContiguousError: a series' rows resume after another series' rows (raised as
            soon as the batch that shows it is read, naming the series).
    """
    passed: set[int] = set()  # id hashes of the series whose rows have ended
    open_hash: int | None = None  # the series the previous batch ended in
    pending: list[pd.DataFrame] = []  # rows read but not yet handed out
    pending_rows = 0
    starts: list[int] = []  # row offsets in `pending` where a series begins
    for batch in batches:
        if len(batch) == 0:
            continue
        ids = batch[ID].to_numpy(dtype=object)
        # Hashes compare and store cheaply; two ids colliding in 64 bits would at worst make
        # a grouped file look ungrouped.
        hashes = pd.util.hash_array(ids)
        run_starts = np.r_[0, np.flatnonzero(hashes[1:] != hashes[:-1]) + 1]
        run_hashes = hashes[run_starts].tolist()
        continues = run_hashes[0] == open_hash
        if open_hash is not None and not continues:
            passed.add(open_hash)
        first_new = 1 if continues else 0
        if len(set(run_hashes)) < len(run_hashes) or not passed.isdisjoint(run_hashes[first_new:]):
            _raise_repeat(ids[run_starts], run_hashes, first_new, passed)
        passed.update(run_hashes[:-1])
        open_hash = run_hashes[-1]
        starts.extend((run_starts[first_new:] + pending_rows).tolist())
        pending.append(batch)
        pending_rows += len(batch)
        while len(starts) > chunk_series:  # the last series may go on in the next batch
            end = starts[chunk_series]
            rows = _concat(pending)
            yield rows.iloc[:end].reset_index(drop=True)
            rest = rows.iloc[end:]
            pending, pending_rows = [rest], len(rest)
            starts = [s - end for s in starts[chunk_series:]]
    if pending_rows:
        yield _concat(pending).reset_index(drop=True)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _raise_repeat(
    run_ids: np.ndarray, run_hashes: list[int], first_new: int, passed: set[int]
) -> None:
    """Name the first series of a batch's runs that had rows before (in `passed`, or in an
    earlier run of the same batch)."""
    met: set[int] = set()
    for k, h in enumerate(run_hashes):
        if h in met or (k >= first_new and h in passed):
            sid = str(run_ids[k])
            raise SeriesNotContiguousError(
                f"series {sid!r}: its rows are not contiguous in the input; batch scoring "
                f"streams series by series, so sort the file by {ID}, {TIME} first",
                series_id=sid,
                field=ID,
            )
        met.add(h)
    raise AssertionError("called without a repeated series")
