"""The registered model's code: an MLflow pyfunc around ``Forecaster.load``.

Logged with MLflow's models-from-code (this file is stored with the model and executed at
load time), so no PythonModel object is pickled. The weights and JSON config
are the artifact named ``forecaster``: the directory ``Forecaster.save`` wrote. Loading reads
JSON and safetensors only.

Input: a long frame, the history of one or many series (``unique_id``, ``ds``, ``y`` and the
model's covariates). For a model with known-future covariates, append each series' future
rows with ``y`` empty and the covariates filled. Params: ``horizon`` (int) and ``quantiles``
(list of floats). Output: ``unique_id``, ``ds``, ``mean`` and one ``q<level>`` column per
quantile.
"""

from __future__ import annotations

import os

import mlflow
import pandas as pd

from forecaster.data import split_future_rows


class ForecasterModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        from forecaster import Forecaster

        # The same env variable the service reads; None picks cuda when present, else cpu.
        device = os.environ.get("FORECASTER_DEVICE") or None
        self.forecaster = Forecaster.load(context.artifacts["forecaster"], device=device)

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None):
        params = params or {}
        frame = pd.DataFrame(model_input)
        frame, future = split_future_rows(frame, self.forecaster.model_config.covariates)
        horizon = params.get("horizon")
        quantiles = params.get("quantiles")
        return self.forecaster.predict(
            frame,
            horizon=None if horizon is None else int(horizon),
            quantiles=None if quantiles is None else [float(q) for q in quantiles],
            future_df=future,
        )


mlflow.models.set_model(ForecasterModel())
