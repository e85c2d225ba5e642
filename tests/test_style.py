"""The workflow stays lint-clean and formatted: `snakemake --lint` and `snakefmt --check`."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_snakemake_lint_is_clean():
    result = subprocess.run([sys.executable, "-m", "snakemake", "--lint", "--cores", "1"], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr, result.stdout


def test_snakefmt_check_is_clean():
    snakefmt = Path(sys.executable).with_name("snakefmt")
    result = subprocess.run([str(snakefmt), "--check", "Snakefile", "workflow"], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_conda_env_installs_what_requirements_install():
    """envs/inference.yaml (for --sdm conda) names every package requirements.txt does."""
    import re

    import yaml

    def names(lines):
        return {re.split(r"[<>=!~ ]", line.strip())[0].lower() for line in lines if line.strip() and line[0] not in "#-"}

    env = yaml.safe_load((REPO / "envs" / "inference.yaml").read_text())
    pip = next(item["pip"] for item in env["dependencies"] if isinstance(item, dict))
    required = names((REPO / "requirements.txt").read_text().splitlines()) - {"snakemake"}
    assert required <= names(pip)
