"""The workflow as a Snakemake module of a user's own workflow, and the catalog's description of it."""

import re
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

import patience
import reference
from factory import REPO, input_frame, local_env, workflow_config, write_input
from tiny_models import build_lora_on_plain_base

NAMES = ["neg", "neu", "pos"]
USER_SNAKEFILE = """\
configfile: "config/config.yaml"


module shardinfer:
    snakefile:
        "{repo}/workflow/Snakefile"
    config:
        config


use rule * from shardinfer as shardinfer_*


rule label_table:
    default_target: True
    input:
        rules.shardinfer_gather.output.predictions,
    output:
        rows="labels.tsv",
        counts="label_counts.tsv",
    script:
        "scripts/label_table.py"
"""
# A script, not `run:`: Snakemake spawns a `run:` job as a new Snakemake process that parses the workflow again.
USER_SCRIPT = """\
import pandas as pd

snakemake = globals()["snakemake"]
table = pd.read_parquet(snakemake.input[0], columns=["id", "label"])
table.to_csv(snakemake.output.rows, sep="\\t", index=False)
table["label"].value_counts().rename_axis("label").to_csv(snakemake.output.counts, sep="\\t")
"""


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
    """A user's folder (not the repository) whose own Snakefile runs the workflow as a module, on its own
    config and data: a base model as shipped, a LoRA adapter with a 3-row head and `model.labels`."""
    base, adapter, edited = build_lora_on_plain_base(tmp_path_factory.mktemp("models"))
    user = tmp_path_factory.mktemp("user")
    frame = input_frame(40, seed=11)
    write_input(frame, user / "data" / "texts.parquet")
    config = workflow_config("data/texts.parquet", base, shards=2, adapter=adapter, model={"labels": NAMES})
    (user / "config").mkdir()
    (user / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    (user / "Snakefile").write_text(USER_SNAKEFILE.format(repo=REPO))
    (user / "scripts").mkdir()
    (user / "scripts" / "label_table.py").write_text(USER_SCRIPT)
    command = [sys.executable, "-m", "snakemake", "--cores", "2", "--set-threads", "shardinfer_infer=1"]
    env = local_env(user)
    result = patience.run(command, [user], cwd=user, env=env)
    return user, frame, result, (edited, adapter)


@pytest.mark.e2e
def test_a_users_workflow_runs_it_as_a_module_and_reads_its_results(user_run):
    user, frame, result, (edited, adapter) = user_run
    assert result.returncode == 0, result.stderr[-3000:]
    predictions = pd.read_parquet(user / "results" / "predictions.parquet")
    assert predictions["index"].tolist() == list(range(len(frame)))
    want_ids, want_probs = reference.classify(edited, frame["text"].tolist(), 32, adapter=adapter)
    np.testing.assert_allclose(np.stack(predictions["probs"]), want_probs, atol=1e-5)
    assert predictions["label"].tolist() == [NAMES[i] for i in want_ids]

    rows = pd.read_csv(user / "labels.tsv", sep="\t")
    assert rows["id"].tolist() == frame["id"].tolist() and rows["label"].tolist() == predictions["label"].tolist()
    counts = pd.read_csv(user / "label_counts.tsv", sep="\t").set_index("label")["count"].to_dict()
    assert counts == predictions["label"].value_counts().to_dict()


def test_catalog_file_names_the_flags_and_deployment_the_readme_gives():
    catalog = yaml.safe_load((REPO / ".snakemake-workflow-catalog.yml").read_text())
    usage = catalog["usage"]
    readme = (REPO / "README.md").read_text()
    flags = usage["mandatory-flags"]["flags"]
    assert usage["mandatory-flags"]["desc"].strip() and flags in readme
    for flag in re.findall(r"--[\w-]+", flags + " " + usage["mandatory-flags"]["desc"]):
        assert flag in readme, flag
    assert usage["software-stack-deployment"]["conda"] is True and "--sdm conda" in readme
    assert usage["report"] is True and (REPO / "config" / "README.md").is_file()


@pytest.mark.e2e
@pytest.mark.repo
def test_the_catalogs_standard_layout_and_its_rulegraph_check_hold(tmp_path):
    """Standardized usage wants workflow/Snakefile, config/README.md and the catalog file; its
    workflow page draws the rule graph of `snakemake -s workflow/Snakefile -c 1 -d .test --forceall
    --rulegraph`, which must run in a fresh clone (no jobs run: a second or two)."""
    assert (REPO / "workflow" / "Snakefile").is_file() and (REPO / "config" / "README.md").is_file()
    command = [sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "-c", "1", "-d", ".test", "--forceall",
               "--rulegraph"]
    result = patience.run(command, cwd=REPO, env=local_env(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    edges = set(re.findall(r"(\d+) -> (\d+)", result.stdout))
    names = dict(re.findall(r'(\d+)\[label = "(\w+)"', result.stdout))
    assert {(names[a], names[b]) for a, b in edges} >= {("plan", "infer"), ("infer", "gather"),
                                                         ("gather", "report_items"), ("gather", "all"),
                                                         ("report_items", "all")}
