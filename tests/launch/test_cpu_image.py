"""The Dockerfile's cpu target, built here with buildah, runs the quickstart (scripts/build_cpu_image.sh).
Very slow (downloads the CPU stack): also needs MEGARL_IMAGE_TESTS=1 and MEGARL_IMAGE_BASE, a Python 3.12
image buildah can pull or has (Debian's packages give no 3.12 to build one from)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import REPO

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("MEGARL_IMAGE_TESTS") != "1", reason="set MEGARL_IMAGE_TESTS=1"),
              pytest.mark.skipif(not os.environ.get("MEGARL_IMAGE_BASE"), reason="set MEGARL_IMAGE_BASE"),
              pytest.mark.skipif(not shutil.which("buildah"), reason="apt-get install buildah")]


def test_cpu_image_builds_and_runs_the_quickstart(tmp_path):
    env = {**os.environ, "IMAGE_WORK": os.environ.get("MEGARL_IMAGE_WORK", str(tmp_path / "image")),
           "BASE_IMAGE": os.environ["MEGARL_IMAGE_BASE"], "LOCAL_WHEELS_FROM": os.environ.get("MEGARL_LOCAL_WHEELS", "")}
    done = subprocess.run([str(REPO / "scripts" / "build_cpu_image.sh")], env=env, capture_output=True, text=True,
                          timeout=3600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[megarl] step 2/2" in done.stdout, done.stdout[-3000:]
