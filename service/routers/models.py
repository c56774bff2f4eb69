"""`GET /v1/models` (what is served and what was refused) and `POST /v1/models/reload`."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Response

from service.deps import ManagerDep, SettingsDep, require_api_key
from service.schemas import ModelsResponse, ReloadResponse

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.get("", response_model=ModelsResponse, summary="The loaded model and the last checks")
async def get_models(manager: ManagerDep) -> dict:
    return manager.state()


@router.post(
    "/reload",
    response_model=ReloadResponse,
    dependencies=[Depends(require_api_key)],
    responses={
        202: {"description": "The check is still running; poll GET /v1/models"},
        401: {"description": "API key missing or invalid"},
        403: {"description": "No API key is configured, so reload is disabled"},
    },
    summary="Check the registry alias now; load, smoke-test and swap in a new version",
)
async def reload_model(
    manager: ManagerDep, settings: SettingsDep, response: Response, wait: bool = True
) -> dict:
    check = manager.check_in_background(force=True)
    if wait:
        try:
            # shield: a slow load goes on in the background after we answer 202.
            outcome = await asyncio.wait_for(asyncio.shield(check), settings.request_timeout_s)
        except TimeoutError:
            outcome = None
    else:
        outcome = None
    if outcome is None:
        response.status_code = 202
        return {
            "outcome": "in_progress",
            "message": "the registry check is running; GET /v1/models shows the result",
            "models": manager.state(),
        }
    message = outcome.message
    if settings.workers > 1:  # each worker process holds its own model
        message += (
            f"; in this worker: the other {settings.workers - 1} pick it up at their next "
            f"registry check (within poll_interval_s, {settings.poll_interval_s:g} s)"
        )
    return {"outcome": outcome.outcome, "message": message, "models": manager.state()}
