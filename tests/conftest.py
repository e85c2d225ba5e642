"""Shared fixtures: tiny models built locally from configs, inputs, and a real snakemake runner."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
sys.path.insert(0, str(REPO / "tests"))

import factory  # noqa: E402


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> factory.TinyModels:
    return factory.build_tiny_models(tmp_path_factory.mktemp("models"))
