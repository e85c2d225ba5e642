"""The workflow stays lint-clean and formatted: `snakemake --lint`, `snakefmt --check` and ruff over
the Python code (its rules in pyproject.toml)."""

import sys
from pathlib import Path

import pytest

import patience
from factory import REPO, local_env


@pytest.mark.e2e
@pytest.mark.repo
def test_snakemake_lint_is_clean():
    result = patience.run([sys.executable, "-m", "snakemake", "--lint", "--cores", "1"], cwd=REPO, env=local_env(REPO))
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr, result.stdout


def test_snakefmt_check_is_clean():
    snakefmt = Path(sys.executable).with_name("snakefmt")
    result = patience.run([str(snakefmt), "--check", "Snakefile", "workflow"], cwd=REPO)
    assert result.returncode == 0, result.stderr


def test_ruff_finds_nothing():
    ruff = Path(sys.executable).with_name("ruff")
    result = patience.run([str(ruff), "check", "--no-cache", "--output-format", "concise", "."], cwd=REPO)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr


def test_conda_env_installs_what_requirements_install():
    """envs/inference.yaml (for --sdm conda) pins every package requirements.txt does, to the same versions."""
    import yaml
    from packaging.requirements import Requirement

    def pins(lines):
        requirements = [Requirement(line) for line in lines if line.strip() and line.strip()[0] not in "#-"]
        return {requirement.name.lower(): requirement.specifier for requirement in requirements}

    env = yaml.safe_load((REPO / "envs" / "inference.yaml").read_text())
    pip = next(item["pip"] for item in env["dependencies"] if isinstance(item, dict))
    required = pins((REPO / "requirements.txt").read_text().splitlines())
    required.pop("snakemake")  # runs the workflow; not installed into the jobs' environment
    assert {name: pins(pip).get(name) for name in required} == required
