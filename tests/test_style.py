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
