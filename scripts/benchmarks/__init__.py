"""The benchmarks and load checks: developer tools that time the workflow against the naive way and
its peers, kept apart from the rules' `script:` adapters and the user's tools in scripts/.

`scripts/benchmark.py` is the command line of the shard-job benchmarks (`--task ...`), whose pieces
live here (common.py: shapes, models, data; one module per task). The other tools here run as
modules from the clone's root, scripts/ on the path:

    PYTHONPATH=workflow:scripts .venv/bin/python -m benchmarks.scale --rows 1000000
    PYTHONPATH=workflow:scripts .venv/bin/python -m benchmarks.load_check
    PYTHONPATH=workflow:scripts .venv/bin/python -m benchmarks.demo_vs_st
    PYTHONPATH=workflow:scripts .venv/bin/python -m benchmarks.logprobs --rows 64
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the clone: its Snakefile and config/ are what runs
