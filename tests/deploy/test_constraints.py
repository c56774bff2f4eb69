"""constraints.txt: every install of the project (make venv, the compose image) is pinned to
the versions the tests last passed with, and the pins cover what pyproject.toml asks for."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.test_compose import dockerfile, load_compose

REPO = Path(__file__).resolve().parents[2]


def pins() -> dict[str, str]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    found = {}
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version, f"constraints.txt: {line!r} is not NAME==VERSION"
        found[canonicalize_name(name)] = version
    return found


def test_every_dependency_is_pinned_and_torch_is_left_to_the_install():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    for extra in ("spark", "postgres"):  # what dev brings in by naming the project itself
        wanted += project["optional-dependencies"][extra]
    pinned = pins()
    for text in wanted:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name in ("forecaster", "torch"):
            continue
        assert name in pinned, f"{req.name} (pyproject.toml) has no pin in constraints.txt"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {req.name}=={pinned[name]}, outside pyproject's {req.specifier}"
        )
    # A pinned torch would be the CPU build for everyone; the Makefile's TORCH_SPEC chooses.
    assert "torch" not in pinned


def test_make_venv_and_the_image_install_under_the_constraints():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^CONSTRAINTS \?= -c constraints\.txt$", makefile, re.M)
    assert re.search(r'pip install -q \$\(CONSTRAINTS\) -e "\.\[dev\]"', makefile)
    lines = dockerfile(load_compose({}))
    copied = [word for line in lines if line.startswith("COPY ") for word in line.split()[1:-1]]
    for source in copied:
        assert (REPO / source).exists(), f"the image copies {source}, which is not in the repo"
    [install] = [line for line in lines if "pip install" in line and '".[' in line]
    assert "-c constraints.txt" in install and "constraints.txt" in copied
