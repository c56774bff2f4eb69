"""Command line of the pipelines: train, evaluate, promote, retrain, rollback, predict, monitor,
schedule.

``service/cli.py`` adds these to the ``forecaster`` entry point with ``register_commands``;
``python -m pipelines.cli`` runs them on their own. Problems a user can fix (bad data or
settings, an unknown model or alias, an unreachable tracking server, a held lock) end with
one line on stderr naming the problem and a non-zero exit code, without a traceback:

    2  bad input data or settings        3  unknown (or unloadable) model, version or alias
    4  tracking server unreachable       5  another run holds the pipeline lock
    1  anything else (with traceback)    130 interrupted
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import logging
import sys
import warnings
from collections.abc import Callable
from typing import Any

import yaml

from forecaster.errors import ForecasterInputError, InvalidConfigError
from pipelines.errors import (
    InvalidModelUriError,
    ModelNotFoundError,
    PipelineLockedError,
    TrackingUnavailableError,
)
from pipelines.interrupt import exit_on_sigterm

logger = logging.getLogger("pipelines")

EXIT_INPUT, EXIT_NOT_FOUND, EXIT_UNREACHABLE, EXIT_LOCKED = 2, 3, 4, 5

_QUIET_LOGGERS = ("mlflow", "alembic", "urllib3", "httpx", "git", "matplotlib", "PIL")


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)
    if not verbose:
        warnings.filterwarnings("ignore", module=r"mlflow(\..*)?")
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"pydantic(\..*)?")


def command(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a handler: logging, SIGTERM, and user errors as one line plus an exit code."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        _configure_logging(getattr(args, "verbose", False))
        exit_on_sigterm()
        try:
            return handler(args)
        except (ForecasterInputError, InvalidModelUriError) as exc:
            return _fail(exc, EXIT_INPUT)
        except ModelNotFoundError as exc:
            return _fail(exc, EXIT_NOT_FOUND)
        except TrackingUnavailableError as exc:
            return _fail(exc, EXIT_UNREACHABLE)
        except PipelineLockedError as exc:
            return _fail(exc, EXIT_LOCKED)
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130

    return run


def _fail(exc: Exception, code: int) -> int:
    message = " ".join(str(exc).split())
    print(f"error: {message}", file=sys.stderr)
    return code


# -- settings from arguments ----------------------------------------------------------------


def _parse_set(items: list[str] | None) -> dict[str, Any]:
    """``--set model.context_length=96 --set promotion_margin=0.02`` as nested overrides."""
    overrides: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise InvalidConfigError(
                f"--set: expected KEY=VALUE (e.g. model.context_length=96), got {item!r}",
                field="set",
            )
        value = yaml.safe_load(raw) if raw else ""
        section, dot, field = key.partition(".")
        if dot:
            overrides.setdefault(section, {})[field] = value
        else:
            overrides[key] = value
    return overrides


def load_settings(args: argparse.Namespace):
    from pipelines.settings import PipelineSettings

    overrides = _parse_set(getattr(args, "set", None))
    for name in ("tracking_uri", "experiment", "model_name", "data"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    # pydantic-settings merges --set's model and train sections key by key over the YAML's and
    # the environment's, and validates once: a --set may fix what the YAML alone gets wrong.
    return PipelineSettings.load(getattr(args, "config", None), **overrides)


def _positive_int(raw: str) -> int:
    """argparse type of counts: a bad value exits with status 2 naming the option."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {raw!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _common(parser: argparse.ArgumentParser, *, data: bool = True) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML settings file")
    parser.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default: FORECASTER_TRACKING_URI, MLFLOW_TRACKING_URI, "
        "else sqlite:///mlflow.db)",
    )
    parser.add_argument("--experiment", help="MLflow experiment name (default: forecaster)")
    parser.add_argument("--model-name", help="registered model name (default: forecaster)")
    if data:
        parser.add_argument("--data", metavar="PATH", help="CSV or Parquet, long or wide")
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a setting, e.g. model.context_length=96, train.max_epochs=5, "
        "promotion_margin=0.02 (repeatable)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


# -- handlers -------------------------------------------------------------------------------


def _print_table(evaluation) -> None:
    print(evaluation.table().to_string(index=False, float_format=lambda v: f"{v:.4f}"))


@command
def train_command(args: argparse.Namespace) -> int:
    from pipelines.lock import pipeline_lock
    from pipelines.retrain import PipelineRun, load_data, train_and_register
    from pipelines.tracking import tracking_errors

    settings = load_settings(args)
    with (
        pipeline_lock(settings.lock_file),
        tracking_errors(settings.resolved_tracking_uri),
        PipelineRun(settings, "train") as run,
    ):
        data = load_data(settings, None)
        run.log_data(data)
        summary = train_and_register(settings, data, run)
    print(f"run       {summary.run_id}")
    _print_glitches(summary.training.glitches)
    print(f"version   {summary.version.name} v{summary.version.version} -> @challenger")
    _print_table(summary.evaluation)
    return 0


def _print_glitches(count: int) -> None:
    if count:
        print(
            f"glitches  {count} reading(s) of the training data look like glitches "
            f"(listed in the run's data/training_glitches.csv)"
        )


@command
def evaluate_command(args: argparse.Namespace) -> int:
    from pipelines.evaluate import evaluate
    from pipelines.ingest import ingest
    from pipelines.registry import load_forecaster
    from pipelines.retrain import PipelineRun
    from pipelines.tracking import tracking_errors

    settings = load_settings(args)
    if settings.data is None:
        raise ForecasterInputError("evaluate: pass --data PATH (the series to backtest on)")
    model_uri = args.model or settings.champion_uri
    windows = args.windows or settings.backtest_windows
    with tracking_errors(settings.resolved_tracking_uri), PipelineRun(settings, "evaluate") as run:
        loaded = load_forecaster(model_uri, tracking_uri=run.uri, device=args.device)
        model = loaded.forecaster
        run.client.set_tag(run.run_id, "evaluated_model", loaded.ref.uri)
        run.client.set_tag(run.run_id, "evaluated_version", loaded.ref.version)
        data = ingest(
            settings.data,
            covariates=model.model_config.covariates,
            min_length=model.min_history + windows * model.max_horizon,
            time_column=settings.time_column,
            requirement=f"{windows} backtest window(s) of {model.max_horizon} after at least "
            f"{model.min_history} point(s) of history need "
            f"{model.min_history + windows * model.max_horizon} per series",
        )
        run.log_data(data, **{"backtest.windows": windows})
        evaluation = evaluate(
            model,
            data.frame,
            n_windows=windows,
            client=run.client,
            run_id=run.run_id,
            plot_series=settings.plot_series,
        )
    print(f"run       {run.run_id}")
    print(f"model     {loaded.ref.name} v{loaded.ref.version} ({model_uri})")
    _print_table(evaluation)
    return 0


@command
def promote_command(args: argparse.Namespace) -> int:
    from pipelines.lock import pipeline_lock
    from pipelines.promote import promote_with_settings
    from pipelines.retrain import load_data

    settings = load_settings(args)
    with pipeline_lock(settings.lock_file):
        data = load_data(settings, None)
        decision = promote_with_settings(settings, data.frame)
    print(f"decision  {'promoted' if decision.promoted else 'not promoted'}: {decision.reason}")
    print(f"champion  {settings.model_name} v{decision.champion_version}")
    return 0


@command
def retrain_command(args: argparse.Namespace) -> int:
    from pipelines.retrain import retrain

    settings = load_settings(args)
    result = retrain(settings)
    _print_retrain(settings, result)
    return 0


def _print_retrain(settings, result) -> None:
    print(
        f"run       {result.run_id} (experiment {settings.experiment!r} at {settings.resolved_tracking_uri})"
    )
    print(f"data      {result.fingerprint}")
    _print_glitches(result.training_glitches)
    if result.monitoring is not None:
        _print_monitoring(result.monitoring)
    if result.unchanged is not None:
        print(f"unchanged {result.unchanged.reason}")
        print(f"champion  {settings.model_name} v{result.champion_version}")
        return
    print(f"version   {result.version.name} v{result.version.version} -> @challenger")
    _print_table(result.evaluation)
    verdict = "promoted" if result.decision.promoted else "not promoted"
    print(f"decision  {verdict}: {result.decision.reason}")
    if result.refit_version is not None:
        print(
            f"refit     {result.version.name} v{result.refit_version.version}: "
            f"v{result.version.version}'s configuration trained on all the data"
        )
    print(f"champion  {result.version.name} v{result.champion_version}")


def _print_monitoring(result) -> None:
    for version in result.versions:
        a = result.realised.versions[version]
        print(
            f"realised  v{version}: MAE {a.mae:.4g}  MASE {a.mase:.4g}  coverage {a.coverage:.3g}"
            f" (nominal {a.level:.3g})  {a.points} point(s), {a.series} series, to {a.last_ds}"
        )
    state = "DEGRADED" if result.degraded else "ok"
    if result.champion_version is None:
        state = "none"  # the scheduler retrains then
    print(f"champion  {state}: {result.reason}")


# `forecaster monitor`'s exit code for a degraded champion, for cron or CI to alert on.
DEGRADED_EXIT = 6


@command
def monitor_command(args: argparse.Namespace) -> int:
    from pipelines.retrain import check_champion

    settings = load_settings(args)
    result = check_champion(settings)
    _print_monitoring(result)
    return DEGRADED_EXIT if result.degraded else 0


@command
def rollback_command(args: argparse.Namespace) -> int:
    from pipelines.lock import pipeline_lock
    from pipelines.rollback import rollback

    settings = load_settings(args)
    with pipeline_lock(settings.lock_file):
        result = rollback(
            model_name=settings.model_name,
            to_version=args.to_version,
            tracking_uri=settings.resolved_tracking_uri,
        )
    if result.from_version == result.to_version:
        print(f"champion  {result.model_name} v{result.to_version} already: nothing changed")
        return 0
    before = "none" if result.from_version is None else f"v{result.from_version}"
    print(f"champion  {result.model_name} {before} -> v{result.to_version}")
    return 0


@command
def predict_command(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    quantiles = None
    if args.quantiles:
        try:
            quantiles = [float(q) for q in args.quantiles.split(",") if q.strip()]
        except ValueError:
            raise InvalidConfigError(
                f"--quantiles: expected numbers separated by commas, got {args.quantiles!r}",
                field="quantiles",
            ) from None
    if args.engine == "spark":
        if importlib.util.find_spec("pyspark") is None:
            raise InvalidConfigError(
                "--engine spark needs pyspark, which is not installed; "
                "pip install 'forecaster[spark]', or use --engine local",
                field="engine",
            )
        from pipelines.spark import predict_spark  # pyspark only when asked for

        summary = predict_spark(
            args.model or settings.champion_uri,
            args.input,
            args.output,
            master=args.master,
            horizon=args.horizon,
            quantiles=quantiles,
            tracking_uri=settings.resolved_tracking_uri,
            device=args.device,
            glitches_output=args.glitches,
        )
    else:
        from pipelines.predict import predict_file

        summary = predict_file(
            args.model or settings.champion_uri,
            args.input,
            args.output,
            horizon=args.horizon,
            quantiles=quantiles,
            chunk_series=args.chunk_series or settings.predict_chunk_series,
            tracking_uri=settings.resolved_tracking_uri,
            device=args.device,
            time_column=settings.time_column,
            progress=not args.no_progress,
            forecast_log=None if args.no_forecast_log else settings.forecast_log,
            glitches_output=args.glitches,
        )
    model = f"{summary.model.name} v{summary.model.version}" if summary.model else args.model
    inputs = "" if summary.n_input_rows is None else f" ({summary.n_input_rows} input rows)"
    print(
        f"wrote {summary.n_output_rows} forecast rows for {summary.n_series} series{inputs} "
        f"with {model} to {summary.output} in {summary.seconds:.1f}s"
    )
    if summary.n_glitches:
        listed = (
            f"listed in {summary.glitches_output}"
            if summary.glitches_output
            else "--glitches PATH lists them"
        )
        print(
            f"{summary.n_glitches} readings of {summary.n_series_with_glitches} series were read "
            f"as glitches and not used ({listed})"
        )
    return 0


@command
def schedule_command(args: argparse.Namespace) -> int:
    from pipelines.schedule import run_schedule

    settings = load_settings(args)
    report = run_schedule(
        settings,
        cron=args.cron,
        max_runs=args.max_runs,
        run_now=args.run_now,
        on_degradation=args.on_degradation,
    )
    print(
        f"scheduler stopped after {report.runs} run(s): {report.succeeded} succeeded, "
        f"{report.failed} failed, {report.skipped} skipped, {report.healthy} healthy"
    )
    return 0 if report.failed == 0 else 1


# -- wiring -----------------------------------------------------------------------------


def register_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add the pipeline commands to an argparse ``subparsers`` object."""
    p = subparsers.add_parser(
        "train", help="ingest, train, evaluate and register a model as @challenger"
    )
    _common(p)
    p.set_defaults(handler=train_command)

    p = subparsers.add_parser(
        "evaluate", help="backtest a registered model against seasonal naive, logged to MLflow"
    )
    _common(p)
    p.add_argument("--model", help="model URI (default: models:/NAME@champion)")
    p.add_argument("--windows", type=_positive_int, help="backtest windows (default: setting)")
    p.add_argument("--device", help="cpu, cuda, ... (default: cuda when present)")
    p.set_defaults(handler=evaluate_command)

    p = subparsers.add_parser(
        "promote", help="move @champion to @challenger if it is better on the latest data"
    )
    _common(p)
    p.set_defaults(handler=promote_command)

    p = subparsers.add_parser(
        "retrain", help="ingest -> train -> evaluate -> register -> promote, as one run"
    )
    _common(p)
    p.set_defaults(handler=retrain_command)

    p = subparsers.add_parser("rollback", help="point @champion back at the previous champion")
    _common(p, data=False)
    p.add_argument("--to-version", help="version to roll back to (default: the one replaced)")
    p.set_defaults(handler=rollback_command)

    p = subparsers.add_parser(
        "predict", help="forecast every series of a file with a registered model"
    )
    _common(p, data=False)
    p.add_argument(
        "--model", help="models:/NAME@alias, models:/NAME/VERSION or a saved model directory"
    )
    p.add_argument("--input", required=True, metavar="PATH", help="CSV or Parquet history")
    p.add_argument(
        "--output",
        required=True,
        metavar="PATH",
        help="CSV or Parquet forecasts (--engine spark: a directory of Parquet parts)",
    )
    p.add_argument("--horizon", type=_positive_int, help="steps to forecast (default: the model's)")
    p.add_argument("--quantiles", help="comma-separated, e.g. 0.1,0.9 (default: the model's)")
    p.add_argument("--chunk-series", type=_positive_int, help="series per batch (default: setting)")
    p.add_argument("--device", help="cpu, cuda, ... (default: cuda when present)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--glitches",
        metavar="PATH",
        help="CSV or Parquet listing (unique_id, ds) each reading the model read as a glitch "
        "and did not use",
    )
    p.add_argument(
        "--no-forecast-log",
        action="store_true",
        help="do not append the forecasts to the forecast log (setting forecast_log)",
    )
    p.add_argument(
        "--engine",
        choices=("local", "spark"),
        default="local",
        help="local: stream the file in this process; spark: groupBy + applyInPandas on "
        "--master (needs the 'spark' extra; writes no forecast log)",
    )
    p.add_argument(
        "--master",
        default="local[2]",
        help="Spark master with --engine spark: local[N], yarn, k8s://..., spark://... "
        "(default: local[2])",
    )
    p.set_defaults(handler=predict_command)

    p = subparsers.add_parser(
        "monitor",
        help="score the champion's logged forecasts against the data observed since (no training)",
    )
    _common(p)
    p.set_defaults(handler=monitor_command)

    p = subparsers.add_parser("schedule", help="run retrain on a cron schedule")
    _common(p)
    p.add_argument("--cron", help="cron expression (default: the schedule setting, 0 3 * * *)")
    p.add_argument("--max-runs", type=_positive_int, help="stop after this many runs")
    p.add_argument("--run-now", action="store_true", help="run once at start too")
    p.add_argument(
        "--on-degradation",
        action="store_true",
        help="at each tick, score the champion first and retrain only when it is degraded "
        "(or there is no champion)",
    )
    p.set_defaults(handler=schedule_command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.cli", description="Forecaster MLflow pipelines"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_commands(subparsers)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
