"""What `pip install` and an sdist carry: the licence, the package data, and every fixture the
tests read (a suite run from an unpacked sdist must find its captures)."""

import os
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
build_meta = pytest.importorskip("setuptools.build_meta")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist, wheel) built by the setuptools installed here (no network), as pip would."""
    out = tmp_path_factory.mktemp("dist")
    here = os.getcwd()
    os.chdir(ROOT)  # setuptools builds the project in the current directory
    try:
        sdist = build_meta.build_sdist(str(out))
        wheel = build_meta.build_wheel(str(out))
    finally:
        os.chdir(here)
    return out / sdist, out / wheel


def test_the_sdist_has_the_licence_and_every_file_the_tests_read(built):
    sdist, _ = built
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    fixtures = {str(p.relative_to(ROOT)) for top in ("tests/fixtures", "deploy") for p in (ROOT / top).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    assert "LICENSE" in names and "scripts/test" in names
    assert fixtures and fixtures <= names, sorted(fixtures - names)[:5]


def test_the_wheel_declares_mit_and_carries_the_licence_and_package_data(built):
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in metadata
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert any(n.startswith("gpuvet/specs/data/") and n.endswith(".csv") for n in names)
    assert "Classifier: Operating System :: POSIX :: Linux" in metadata
