"""Integer `ds`: steps with no calendar, read, forecast and given back as integers."""

import numpy as np
import pandas as pd
import pytest

from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.errors import (
    DuplicateTimestampsError,
    FrequencyInferenceError,
    InvalidConfigError,
    InvalidTimestampsError,
    IrregularTimestampsError,
    MissingCovariatesError,
    NonNumericValuesError,
)
from forecaster.synthetic import generate_synthetic
from forecaster.time_axis import is_integer_axis, parse_freq, season_length
from forecaster.validation import infer_frequency, validate_long_frame

from .conftest import TINY_MODEL, TINY_TRAIN

STEP, FIRST = 7, 100


def steps_frame(n_series: int = 3, dtype: str = "int64") -> pd.DataFrame:
    """Series of 90-120 points on integer steps of 7 from 100, each its own level."""
    rng = np.random.default_rng(0)
    parts = []
    for k in range(n_series):
        n = 90 + 15 * k
        t = np.arange(n)
        parts.append(
            pd.DataFrame(
                {
                    "unique_id": f"s{k}",
                    "ds": (FIRST + STEP * t).astype(dtype),
                    "y": k + np.sin(t / 3) + rng.normal(0, 0.1, n),
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


@pytest.fixture(scope="module")
def steps() -> pd.DataFrame:
    return steps_frame()


@pytest.fixture(scope="module")
def fitted_on_steps(steps) -> Forecaster:
    return Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(steps)


def test_integer_ds_has_a_step_frequency_and_no_season(steps):
    validated = validate_long_frame(steps)
    assert validated.freq == "7ns" and is_integer_axis(validated.freq)
    assert infer_frequency(steps) == "7ns"
    assert season_length("7ns") == 1 and season_length("ns") == 1
    assert not is_integer_axis("h") and not is_integer_axis("us")
    assert is_integer_axis("7") and parse_freq("7") == parse_freq("7ns")  # Nixtla's freq=7


def test_missing_integer_steps_are_filled_as_missing_values(steps):
    gappy = steps.drop(index=[10, 11])
    validated = validate_long_frame(gappy, allow_missing=True)
    s0 = validated.frame[validated.frame["unique_id"] == "s0"]
    assert len(s0) == 90
    assert s0["y"].isna().sum() == 2
    assert (np.diff(s0["ds"].to_numpy().view(np.int64)) == STEP).all()


def test_errors_name_the_integer_steps_not_timestamps(steps):
    duplicated = pd.concat([steps, steps.iloc[[5]]], ignore_index=True)
    with pytest.raises(DuplicateTimestampsError, match=r"timestamp 135 appears more than once"):
        validate_long_frame(duplicated)
    off_grid = steps.copy()
    off_grid.loc[3, "ds"] = 122
    with pytest.raises(IrregularTimestampsError, match=r"expected 121 .* found 122"):
        validate_long_frame(off_grid, allow_missing=True)
    text_y = steps.astype({"y": object})
    text_y.loc[4, "y"] = "abc"
    with pytest.raises(NonNumericValuesError, match=r"'abc' at ds=128 "):
        validate_long_frame(text_y)


@pytest.mark.parametrize(
    "ds, error, message",
    [
        (lambda n: np.arange(n) * 1.5, InvalidTimestampsError, "holds numbers"),
        (lambda n: np.arange(n) % 2 == 0, InvalidTimestampsError, "holds numbers"),
        (
            lambda n: pd.array([1, None] + list(range(2, n)), dtype="Int64"),
            InvalidTimestampsError,
            "missing at row 1",
        ),
        (
            lambda n: pd.Timestamp("2024-01-01") + pd.to_timedelta(np.arange(n) * 5, unit="ns"),
            FrequencyInferenceError,
            "5 ns apart",
        ),
    ],
    ids=["float", "bool", "missing", "timestamps-ns-apart"],
)
def test_what_is_not_an_integer_axis_is_refused(ds, error, message):
    df = pd.DataFrame({"unique_id": "a", "ds": ds(40), "y": np.arange(40.0)})
    with pytest.raises(error, match=message):
        validate_long_frame(df)


def test_forecast_continues_the_steps_as_integers_of_the_callers_dtype(fitted_on_steps, steps):
    forecast = fitted_on_steps.predict(steps)
    assert forecast["ds"].dtype == np.int64
    h = fitted_on_steps.max_horizon
    for sid, last in steps.groupby("unique_id")["ds"].max().items():
        ds = forecast.loc[forecast["unique_id"] == sid, "ds"].to_numpy()
        np.testing.assert_array_equal(ds, last + STEP * np.arange(1, h + 1))
    # int32 and nullable Int64 input forecast the same steps
    for dtype in ("int32", "Int64"):
        other = fitted_on_steps.predict(steps.astype({"ds": dtype}))
        np.testing.assert_array_equal(other["ds"].to_numpy(np.int64), forecast["ds"].to_numpy())
        np.testing.assert_allclose(other["mean"], forecast["mean"])


def test_a_model_of_one_kind_of_ds_refuses_the_other(fitted_on_steps, steps, fitted, series):
    as_timestamps = steps.assign(ds=pd.Timestamp("2024-01-01") + pd.to_timedelta(steps["ds"], "h"))
    with pytest.raises(InvalidTimestampsError, match="expected integer steps") as info:
        fitted_on_steps.predict(as_timestamps)
    assert info.value.field == "ds"
    as_steps = series.assign(ds=np.arange(len(series)))
    with pytest.raises(InvalidTimestampsError, match="holds integers .* expected timestamps"):
        fitted.predict(as_steps)


def test_saved_and_loaded_integer_model_forecasts_the_same(fitted_on_steps, steps, tmp_path):
    fitted_on_steps.save(tmp_path / "model")
    loaded = Forecaster.load(tmp_path / "model")
    assert loaded.freq == "7ns"
    pd.testing.assert_frame_equal(loaded.predict(steps), fitted_on_steps.predict(steps))


def test_backtest_scores_integer_windows_and_gives_integer_cutoffs(fitted_on_steps, steps):
    result = fitted_on_steps.backtest(steps, n_windows=2)
    forecasts = result.forecasts
    assert forecasts["ds"].dtype == np.int64 and forecasts["cutoff"].dtype == np.int64
    s0 = forecasts[forecasts["unique_id"] == "s0"]
    last = int(steps.loc[steps["unique_id"] == "s0", "ds"].max())
    h = fitted_on_steps.max_horizon
    assert sorted(s0["cutoff"].unique()) == [last - 2 * h * STEP, last - h * STEP]
    assert np.isfinite(result.metrics["mase"])


def test_future_covariates_are_matched_on_integer_steps():
    df = steps_frame(n_series=2)
    df["promo"] = (df["ds"] // STEP % 5 == 0).astype(float)
    config = ModelConfig(**{**TINY_MODEL, "covariates": ("promo",)})
    model = Forecaster(config, TrainConfig(**{**TINY_TRAIN, "max_epochs": 1})).fit(df)
    h = model.max_horizon
    last = df.groupby("unique_id")["ds"].max()
    future = pd.DataFrame(
        {
            "unique_id": np.repeat(last.index, h),
            "ds": (last.to_numpy()[:, None] + STEP * np.arange(1, h + 1)).reshape(-1),
            "promo": 1.0,
        }
    )
    forecast = model.predict(df, future_df=future)
    assert forecast["ds"].dtype == np.int64 and len(forecast) == 2 * h
    with pytest.raises(MissingCovariatesError, match=rf"the first at {last.iloc[0] + STEP}\b"):
        model.predict(df, future_df=future.assign(ds=future["ds"] + 1))


def test_calendar_features_are_refused_for_integer_ds(steps):
    config = ModelConfig(**{**TINY_MODEL, "calendar_features": ("hour_of_day",)})
    with pytest.raises(InvalidConfigError, match="none for integer ds") as info:
        Forecaster(config, TrainConfig(**TINY_TRAIN)).fit(steps)
    assert info.value.field == "calendar_features"


def test_a_given_season_is_kept_for_integer_ds():
    resolved = ModelConfig(prediction_length=8, season_length=12).for_frequency("7ns")
    assert resolved.season_length == 12 and resolved.patch_length == 12
    assert ModelConfig(prediction_length=8).for_frequency("7ns").season_length == 1


def test_text_that_spells_steps_reads_as_steps_for_a_step_model(fitted_on_steps, steps):
    """A CSV read as text (the service's batch jobs) forecasts as the integers it spells."""
    as_text = steps.astype({"ds": "str"})
    pd.testing.assert_frame_equal(fitted_on_steps.predict(as_text), fitted_on_steps.predict(steps))
    as_text.loc[7, "ds"] = "12x"
    with pytest.raises(InvalidTimestampsError, match=r"'12x' at row 7 is not an integer step"):
        fitted_on_steps.predict(as_text)


def test_steps_beyond_int64_are_refused_by_value():
    df = pd.DataFrame(
        {"unique_id": "a", "ds": np.array([1, 2, 2**63], dtype=np.uint64), "y": [1.0, 2.0, 3.0]}
    )
    with pytest.raises(InvalidTimestampsError, match=r"9223372036854775808 at row 2 is outside"):
        validate_long_frame(df)


def test_steps_with_the_season_given_forecast_as_the_hourly_timestamps_they_number():
    """One axis inside: hourly data numbered 0, 1, 2... with its daily and weekly cycles given
    trains and forecasts bit for bit as the timestamps do (calendar features are off)."""
    hourly = generate_synthetic(n_series=3, n_steps=24 * 14, freq="h", seed=0)
    steps = hourly.assign(ds=(hourly["ds"] - hourly["ds"].min()) // pd.Timedelta(hours=1))
    config = {**TINY_MODEL, "patch_length": None}
    by_time = Forecaster(ModelConfig(**config), TrainConfig(**TINY_TRAIN)).fit(hourly)
    by_step = Forecaster(
        ModelConfig(**config, season_length=24, long_season_length=168), TrainConfig(**TINY_TRAIN)
    ).fit(steps)
    assert by_step.model_config == by_time.model_config  # patch 24 from the given season
    np.testing.assert_array_equal(
        by_step.predict(steps)["mean"].to_numpy(), by_time.predict(hourly)["mean"].to_numpy()
    )
