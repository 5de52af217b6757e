"""The Dockerfile's install step, without Docker: no engine runs in CI, so the image is
not built here. What can break without one is tested: the files the Dockerfile copies
are enough to build psfleet (package data included), and the image's working directory
is the one ``psfleet k8s render`` puts config.yaml in."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from psfleet.cluster.k8s import IMAGE_WORKDIR

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


def _instructions() -> list[list[str]]:
    lines = [line.split() for line in (REPO / "Dockerfile").read_text().splitlines()]
    return [line for line in lines if line and not line[0].startswith("#")]


def test_the_copied_files_build_psfleet_with_its_package_data(tmp_path: Path) -> None:
    copies = [line[1:] for line in _instructions() if line[0] == "COPY"]
    context = tmp_path / "context"
    for *sources, dest in copies:
        for source in sources:
            target = context / dest.lstrip("/")
            if dest.endswith("/"):
                target = target / Path(source).name
            if (REPO / source).is_dir():
                shutil.copytree(REPO / source, target,
                                ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO / source, target)
    (install,) = [line for line in _instructions()
                  if line[0] == "RUN" and "/opt/psfleet" in line and "install" in line]
    project = context / install[install.index("install") + 1].lstrip("/")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-w", str(tmp_path / "wheel"), str(project)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("psfleet-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("psfleet/rpc/psfleet.proto", "psfleet/py.typed",
                   "psfleet/templates/dnn_criteo.yaml", "psfleet/cluster/k8s.py",
                   "psfleet/rpc/health_only.py", "psfleet/ps/table/_core.pyi"):
        assert needed in names, needed
    assert any(n.startswith("psfleet/ps/table/_core.") and n.endswith(".so") for n in names), \
        "the wheel lacks the native core (setup.py not copied?)"


def test_the_image_works_where_k8s_render_puts_the_config() -> None:
    workdirs = [line[1] for line in _instructions() if line[0] == "WORKDIR"]
    assert workdirs == [IMAGE_WORKDIR]
