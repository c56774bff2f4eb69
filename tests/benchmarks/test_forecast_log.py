"""benchmarks.forecast_log at a toy size: the log it writes is what monitoring scores."""

from __future__ import annotations

from benchmarks.forecast_log import main


def test_every_logged_forecast_with_an_actual_is_scored(tmp_path, capsys):
    args = ["--series", "5", "--horizon", "6", "--days", "4", "--version-days", "3"]
    figures = main([*args, "--part-rows", "30"])  # 5 series, a part each
    assert figures["log_rows"] == 5 * 6 * 4
    assert figures["versions"] == 2  # days 0-2, then day 3
    # Actuals end with the last origin's day: its forecasts reach 6 hours into it, all observed.
    assert figures["scored_rows"] == figures["log_rows"]
    assert "read_and_score_s" in capsys.readouterr().out
    assert {
        k: v
        for k, v in main([*args, "--part-rows", "0"]).items()
        if "_s" not in k and "gb" not in k
    } == {k: v for k, v in figures.items() if "_s" not in k and "gb" not in k}
