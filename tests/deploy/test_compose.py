"""docker-compose.yml, checked without a Docker engine.

Every service whose command is ours runs it through the program's own argument parser and
builds its settings with exactly the environment the file gives it, `${VAR:-default}` resolved
as Compose does. Temporary directories stand in for the volumes, at the paths the container
sees rewritten to them; `:ro` ones are read-only, so a validator that wants to write where the
code only reads fails here. MLflow's command goes through MLflow's own click command. Where the
`docker compose` CLI exists, `docker compose config` checks the file as well.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from croniter import croniter
from fastapi.testclient import TestClient
from sqlalchemy import make_url

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
API_KEY = "compose-test-key-0123456789"
# The environments the file is checked under: nothing set (the defaults), and what a real
# deployment sets.
ENVIRONMENTS = {
    "defaults": {},
    "keys-set": {"FORECASTER_SERVICE_API_KEYS": API_KEY, "POSTGRES_PASSWORD": "not-the-default"},
}

# `$$`, `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `$NAME`; any other `${...}` is an
# error here rather than a silent mistake.
_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_]\w*)(?:(?P<op>:?-)(?P<default>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_]\w*)"
    r"|(?P<invalid>\{[^}]*\}))"
)


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """`value` with variables substituted as Compose does (the subset the file may use)."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        if match["escaped"]:
            return "$"
        if match["invalid"]:
            raise ValueError(f"unsupported interpolation ${match['invalid']} in {value!r}")
        name = match["braced"] or match["named"]
        if name not in env or (match["op"] == ":-" and env[name] == ""):
            return match["default"] or ""
        return env[name]

    return _VARIABLE.sub(substitute, value)


def load_compose(env: Mapping[str, str]) -> dict[str, Any]:
    return interpolate(yaml.safe_load(COMPOSE_FILE.read_text()), env)


def dockerfile(compose: dict[str, Any]) -> list[str]:
    """The lines of the image's inline Dockerfile, continuation lines joined."""
    builds = {
        svc["build"]["dockerfile_inline"] for svc in compose["services"].values() if "build" in svc
    }
    assert len(builds) == 1, "expected every built service to share one image"
    return builds.pop().replace("\\\n", " ").splitlines()


def our_services(compose: dict[str, Any], program: str) -> list[str]:
    return [
        name
        for name, svc in compose["services"].items()
        if shlex.split(svc.get("command") or "")[:1] == [program]
    ]


@dataclass
class Mount:
    target: str  # the path inside the container
    read_only: bool
    host: Path  # the temporary directory standing in for it


def parse_mounts(svc: dict[str, Any]) -> list[tuple[str, str, bool]]:
    mounts = []
    for entry in svc.get("volumes", []):
        if isinstance(entry, dict):
            mounts.append((entry["source"], entry["target"], bool(entry.get("read_only"))))
        else:
            source, target, *mode = entry.split(":")
            mounts.append((source, target, "ro" in (mode[0].split(",") if mode else [])))
    return mounts


def is_named_volume(source: str) -> bool:
    return not source.startswith((".", "/", "~"))


class Container:
    """A service's view of the file system: its mounts as temporary directories, its working
    directory (the image's, on no volume) as another."""

    def __init__(self, svc: dict[str, Any], root: Path, monkeypatch: pytest.MonkeyPatch):
        self.workdir = root / "workdir"
        self.workdir.mkdir()
        self.mounts: list[Mount] = []
        for i, (_, target, read_only) in enumerate(parse_mounts(svc)):
            host = root / f"mount{i}"
            host.mkdir()
            self.mounts.append(Mount(target, read_only, host))
            if read_only:
                make_read_only(host, monkeypatch)
        # Longest target first, so a mount inside another one wins.
        self.mounts.sort(key=lambda m: len(m.target), reverse=True)

    def host_path(self, value: str) -> str:
        """`value` with a container path under a mount rewritten to the stand-in directory."""
        for mount in self.mounts:
            if value == mount.target or value.startswith(mount.target.rstrip("/") + "/"):
                return str(mount.host) + value[len(mount.target.rstrip("/")) :]
        return value

    def mount_of(self, path: Path) -> Mount | None:
        path = Path(path).resolve()
        for mount in self.mounts:
            if path.is_relative_to(mount.host.resolve()):
                return mount
        return None

    def assert_on_volume(self, name: str, path: Path, *, writable: bool) -> None:
        mount = self.mount_of(path)
        assert mount is not None, (
            f"{name} = {path} is on no volume of the file: it would be lost with the container "
            "(and the image's directories belong to root)"
        )
        if writable:
            assert not mount.read_only, f"{name} is written, but {mount.target} is mounted :ro"


def make_read_only(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `:ro` mount refuses writes even to root (EROFS). chmod makes the stand-in read-only
    for an unprivileged test; as root (CI in a container), os.access is made to answer as it
    does on a read-only mount, so a validator that asks for write access still fails."""
    directory.chmod(0o555)
    if os.geteuid() != 0:
        return
    real_access = os.access
    root = directory.resolve()

    def access(path: Any, mode: int, *args: Any, **kwargs: Any) -> bool:
        if mode & os.W_OK and Path(path).resolve().is_relative_to(root):
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


@pytest.fixture(params=list(ENVIRONMENTS))
def env_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture()
def compose(env_name: str) -> dict[str, Any]:
    return load_compose(ENVIRONMENTS[env_name])


@pytest.fixture()
def run_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """run_in(svc) -> (Container, argv): the process environment is exactly the service's
    (paths rewritten to the stand-ins), the working directory is the container's."""
    containers: list[Container] = []

    def enter(svc: dict[str, Any]) -> tuple[Container, list[str]]:
        container = Container(svc, tmp_path, monkeypatch)
        containers.append(container)
        for key in list(os.environ):
            if key.startswith(("FORECASTER_", "MLFLOW_", "PROMETHEUS_")):
                monkeypatch.delenv(key)
        for key, value in (svc.get("environment") or {}).items():
            monkeypatch.setenv(key, container.host_path(str(value)))
        monkeypatch.chdir(container.workdir)  # no .env, and relative paths land here
        argv = [container.host_path(arg) for arg in shlex.split(svc["command"])]
        return container, argv

    yield enter
    for container in containers:  # let pytest clean the read-only stand-ins up
        for mount in container.mounts:
            mount.host.chmod(0o755)


def postgres_databases(compose: dict[str, Any]) -> set[str]:
    """Databases the postgres service creates: POSTGRES_DB and its init scripts' CREATE."""
    svc = compose["services"]["postgres"]
    names = {svc["environment"]["POSTGRES_DB"]}
    for source, target, _ in parse_mounts(svc):
        if target.startswith("/docker-entrypoint-initdb.d"):
            script = (COMPOSE_FILE.parent / source).read_text()
            names |= set(re.findall(r"CREATE DATABASE\s+(\w+)", script, flags=re.IGNORECASE))
    return names


def assert_reaches_postgres(compose: dict[str, Any], setting: str, url_text: str) -> None:
    """A PostgreSQL URL names the postgres service, its credentials, a database it creates,
    and a driver the image installs."""
    url = make_url(url_text)
    pg = compose["services"]["postgres"]["environment"]
    assert url.drivername == "postgresql+psycopg", f"{setting}: driver {url.drivername}"
    assert (url.host, url.port) == ("postgres", 5432), f"{setting}: {url.host}:{url.port}"
    assert url.username == pg["POSTGRES_USER"], f"{setting}: user {url.username}"
    assert url.password == pg["POSTGRES_PASSWORD"], f"{setting}: not postgres' password"
    assert url.database in postgres_databases(compose), (
        f"{setting}: database {url.database!r} is created neither by POSTGRES_DB nor by an "
        "init script"
    )
    installed = " ".join(line for line in dockerfile(compose) if "pip install" in line)
    extras = {e for group in re.findall(r"\.\[([\w,-]+)\]", installed) for e in group.split(",")}
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    requirements = [req for extra in extras for req in optional.get(extra, [])]
    assert any(req.startswith("psycopg") for req in requirements) or "psycopg" in installed, (
        f"{setting}: the image installs no psycopg (extras {sorted(extras)})"
    )


def test_service_accepts_a_read_only_input_dir_but_not_a_read_only_data_dir(tmp_path, monkeypatch):
    """The service only reads inputs (jobs by path), but writes jobs and models to data_dir."""
    from pydantic import ValidationError

    from service.settings import ServiceSettings

    inputs, data = tmp_path / "inputs", tmp_path / "data"
    inputs.mkdir()
    data.mkdir()
    make_read_only(inputs, monkeypatch)
    settings = ServiceSettings(_env_file=None, data_dir=data, input_dir=inputs)
    assert settings.input_dir == inputs
    make_read_only(data, monkeypatch)
    with pytest.raises(ValidationError, match="data_dir: expected a writable directory"):
        ServiceSettings(_env_file=None, data_dir=data, input_dir=inputs)
    for directory in (inputs, data):
        directory.chmod(0o755)


def test_the_stack_has_its_services():
    compose = load_compose({})
    assert {"postgres", "mlflow", "service", "retrain", "scheduler"} <= set(compose["services"])
    assert compose["services"]["postgres"]["image"].startswith("postgres:16")
    assert our_services(compose, "forecaster") == ["service", "retrain", "scheduler"]


def test_serve_parses_and_its_settings_validate(compose, run_in, env_name):
    from pipelines.tracking import resolve_tracking_uri
    from service.app import create_app
    from service.cli import build_parser, serve_overrides
    from service.deps import OPEN_PATHS
    from service.settings import ServiceSettings

    svc = compose["services"]["service"]
    container, argv = run_in(svc)
    args = build_parser().parse_args(argv[1:])
    assert args.command == "serve"
    settings = ServiceSettings(**serve_overrides(args))

    container.assert_on_volume("data_dir", settings.data_dir, writable=True)
    container.assert_on_volume("input_dir", settings.input_dir, writable=False)
    if getattr(settings, "jobs_db", None):
        assert_reaches_postgres(compose, "jobs_db", settings.jobs_db)
    published = {int(p.rsplit(":", 1)[1]) for p in svc["ports"]}
    assert settings.port in published and settings.host == "0.0.0.0"
    assert resolve_tracking_uri(settings.tracking_uri) == "http://mlflow:5000"

    # The healthcheck, as Docker runs it: no key, whatever the keys are.
    client = TestClient(create_app(settings))  # no lifespan: no model, no registry needed
    urls = re.findall(r"https?://[^'\"\s]+", " ".join(svc["healthcheck"]["test"]))
    assert urls, "the service's healthcheck requests no URL"
    for url in urls:
        parsed = urlparse(url)
        assert parsed.path in OPEN_PATHS, f"healthcheck {url} is not among the open probes"
        assert parsed.port == settings.port
        assert client.get(parsed.path).status_code == 200
    if settings.api_keys:  # the keys are in force, so the probe's 200 above means something
        assert client.get("/v1/models").status_code == 401


@pytest.mark.parametrize("name", ["retrain", "scheduler"])
def test_pipeline_commands_parse_and_their_settings_validate(compose, run_in, name):
    from pipelines.cli import load_settings
    from pipelines.lock import pipeline_lock
    from pipelines.schedule import scheduler_lock_path
    from service.cli import build_parser

    svc = compose["services"][name]
    container, argv = run_in(svc)
    args = build_parser().parse_args(argv[1:])
    settings = load_settings(args)

    assert settings.resolved_tracking_uri == "http://mlflow:5000"
    container.assert_on_volume("data", settings.data, writable=False)
    container.assert_on_volume("lock_file", settings.lock_file, writable=True)
    if getattr(settings, "forecast_log", None):  # the service's log, scored by retrain
        container.assert_on_volume("forecast_log", settings.forecast_log, writable=False)
    locks = [settings.lock_file]
    if args.command == "schedule":
        assert croniter.is_valid(args.cron), args.cron
        locks.append(scheduler_lock_path(settings))
    for lock in locks:  # taken for real, in the stand-in of the volume
        with pipeline_lock(lock):
            pass


def test_retrain_and_scheduler_share_the_pipeline_lock():
    compose = load_compose({})
    volumes = []
    for name in ("retrain", "scheduler"):
        svc = compose["services"][name]
        lock = Path(svc["environment"]["FORECASTER_LOCK_FILE"])
        [source] = [s for s, target, _ in parse_mounts(svc) if lock.is_relative_to(target)]
        volumes.append(source)
    assert volumes[0] == volumes[1] and is_named_volume(volumes[0]), volumes


def test_mlflow_server_command_parses(compose, run_in):
    import mlflow.cli

    svc = compose["services"]["mlflow"]
    container, argv = run_in(svc)
    assert argv[:2] == ["mlflow", "server"]
    params = mlflow.cli.server.make_context("server", argv[2:]).params  # parsed, not started

    assert_reaches_postgres(compose, "--backend-store-uri", params["backend_store_uri"])
    assert params["serve_artifacts"], "clients could not upload artifacts through the server"
    container.assert_on_volume(
        "--artifacts-destination", Path(params["artifacts_destination"]), writable=True
    )
    # MLflow refuses requests whose Host header it does not allow: its healthcheck's and the
    # other services' must be.
    allowed = set(params["allowed_hosts"].split(","))
    [health] = re.findall(r"https?://[^'\"\s]+", " ".join(svc["healthcheck"]["test"]))
    tracking = urlparse(compose["services"]["service"]["environment"]["MLFLOW_TRACKING_URI"])
    assert {urlparse(health).netloc, tracking.netloc} <= allowed
    assert urlparse(health).port == tracking.port == params["port"]


def test_postgres_healthcheck_waits_for_the_real_server(compose):
    svc = compose["services"]["postgres"]
    test = svc["healthcheck"]["test"]
    assert test[:2] == ["CMD", "pg_isready"]
    options = dict(zip(test[2::2], test[3::2], strict=True))
    # Over TCP: during initialisation the server listens on its socket only.
    assert options["-h"] == "127.0.0.1"
    assert options["-U"] == svc["environment"]["POSTGRES_USER"]
    assert options["-d"] in postgres_databases(compose)


def test_no_service_runs_as_root():
    compose = load_compose({})
    lines = dockerfile(compose)
    [image_user] = [line.split()[1] for line in lines if line.startswith("USER ")][-1:]
    assert image_user.split(":")[0] not in ("root", "0")
    for name, svc in compose["services"].items():
        user = svc.get("user")
        if user is None:
            assert "build" in svc, f"{name} runs as its image's default user (root for most)"
        else:
            assert str(user).split(":")[0] not in ("root", "0"), f"{name} runs as {user}"


def test_volumes_are_declared_and_writable_by_the_image_user():
    compose = load_compose({})
    lines = dockerfile(compose)
    [image_user] = [line.split()[1] for line in lines if line.startswith("USER ")][-1:]
    run = " ".join(line for line in lines if line.startswith("RUN "))
    created = set(re.findall(r"mkdir -p ((?:/[\w/.-]+\s*)+)", run)[0].split())
    chowned = re.findall(rf"chown -R {image_user}(?::\w+)? ((?:/[\w/.-]+\s*)+)", run)
    chowned_dirs = [Path(d) for group in chowned for d in group.split()]
    for name, svc in compose["services"].items():
        for source, target, _ in parse_mounts(svc):
            if not is_named_volume(source):
                # Files the repository ships must be there; ./data is the user's.
                assert source == "./data" or (COMPOSE_FILE.parent / source).exists(), source
                continue
            assert source in (compose.get("volumes") or {}), f"{name}: volume {source} undeclared"
            if "build" in svc:
                # A new named volume takes the owner of the directory it is mounted on.
                assert target in created, f"{name}: {target} is not created in the image"
                assert any(Path(target).is_relative_to(d) for d in chowned_dirs), (
                    f"{name}: {target} does not belong to {image_user} in the image"
                )


def test_dependencies_wait_for_healthchecks():
    compose = load_compose({})
    for name, svc in compose["services"].items():
        for dependency, condition in (svc.get("depends_on") or {}).items():
            assert dependency in compose["services"], f"{name} depends on unknown {dependency}"
            if condition.get("condition") == "service_healthy":
                assert "healthcheck" in compose["services"][dependency], dependency


def _docker_compose() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is None:
        return None
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, check=False)
    return [docker, "compose"] if probe.returncode == 0 else None


@pytest.mark.skipif(_docker_compose() is None, reason="no `docker compose` CLI here")
@pytest.mark.parametrize("env_name", list(ENVIRONMENTS))
def test_docker_compose_reads_the_file_as_these_tests_do(env_name):
    """`docker compose config` accepts the file, and resolves each command and environment
    as load_compose does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORECASTER_", "POSTGRES_"))}
    command = [*_docker_compose(), "-f", str(COMPOSE_FILE), "--profile", "train"]
    command += ["--profile", "scheduler", "config", "--format", "json"]
    result = subprocess.run(
        command, capture_output=True, text=True, check=False, env=env | ENVIRONMENTS[env_name]
    )
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout)["services"]
    ours = load_compose(ENVIRONMENTS[env_name])["services"]
    assert set(resolved) == set(ours)
    for name, svc in ours.items():
        if "command" in svc:
            assert resolved[name]["command"] == shlex.split(svc["command"]), name
        environment = {k: str(v) for k, v in (svc.get("environment") or {}).items()}
        assert resolved[name].get("environment", {}) == environment, name
