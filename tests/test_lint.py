"""The code checks run as part of the test command: ruff (lint + format) and mypy strict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_packaging import PACKAGES

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("check", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(check: list[str]) -> None:
    result = _run("ruff", *check, *PACKAGES, "tests", "bench", "examples", "loadtests")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
