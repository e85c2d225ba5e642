"""The report: gather's run facts and the report items drawn from them (unit tests on a made-up
summary), and one real run whose `snakemake --report report.zip` holds every item."""

from __future__ import annotations

import io
import json
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

import patience
from factory import REPO, prepare_workdir
from shardinfer.core.errors import UserError
from shardinfer.plan.plan_file import Plan
from shardinfer.proof.prove import ShardFile
from shardinfer.proof.summary import run_facts, token_lengths
from shardinfer.report.snakemake_report import (
    MAX_BARS,
    SHARD_COLUMNS,
    ReportFiles,
    html_table,
    load_seconds,
    rows_per_s,
    run_rows,
    shard_columns,
    shard_rows,
    show,
    write_report,
)

ITEMS = ("run.html", "shards.html", "rows_per_s.png", "stages.png", "token_lengths.png")
PNG_SIZE = (800, 400)  # report.SIZE at report.DPI
ROWS, SHARDS = 1000, 4  # the shared classify run (conftest.classify_runs)


def shard_stats(seconds: float, started: float, rows: int = 100, lengths=None) -> dict:
    return {"rows": rows, "seconds": seconds, "real_tokens": 10 * rows, "padded_tokens": 11 * rows, "truncated": 1,
            "device": "cpu (1 threads)", "dtype": "float32", "started": started, "ended": started + seconds + 2.0,
            "stages": {"read": 0.1, "tokenize": 0.4, "batch": 0.2, "device": seconds - 0.5, "write": 0.05},
            "token_lengths": lengths or {"10": rows}}


def made_up_summary(shards: int = 3) -> dict:
    """A summary as gather writes it, shard 1 a straggler."""
    per_shard = []
    for i in range(shards):
        stats = shard_stats(seconds=4.0 if i == 1 else 1.0, started=1000.0 + i)
        per_shard.append({"shard": i, "start": 100 * i, "end": 100 * (i + 1), "estimated_tokens": 900,
                          "bound_by": "device", "padding_ratio": 1.1,
                          **{k: v for k, v in stats.items() if k != "token_lengths"}})
    run = {"rows": 100 * shards, "shards": shards, "task": "classify", "model": "/models/tiny", "adapter": "/lora <a>",
           "max_length": 32, "devices": ["cpu (1 threads)"], "dtype": "float32", "started": 1000.0, "ended": 1010.0,
           "wall_s": 10.0, "rows_per_s": 30.0, "real_tokens_per_s": 300.0, "real_tokens": 3000, "padded_tokens": 3300,
           "padding_ratio": 1.1, "truncated": shards}
    return {"rows": 100 * shards, "shards": shards, "plan_id": "p1", "input": "in.parquet", "per_shard": per_shard,
            "run": run, "token_lengths": {"3": 5, "10": 280, "32": 15}}


def png_size(path: Path | bytes) -> tuple[int, int]:
    """Width and height from a PNG's header (its IHDR chunk), checking the signature first."""
    data = path if isinstance(path, bytes) else path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def table_rows(page: str) -> list[list[str]]:
    """The cells of each row of an HTML table the report wrote (header rows left out)."""
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", page) if "<td" in row]


def report_files(folder: Path) -> ReportFiles:
    return ReportFiles(*(str(folder / name) for name in ITEMS))


def test_the_report_imports_neither_torch_nor_matplotlib_until_it_draws():
    """Gather and the report run anywhere in a second: torch never, matplotlib only to draw."""
    check = ("import sys; import shardinfer.proof.gather, shardinfer.report.snakemake_report; "
             "sys.exit(' '.join(sorted({'torch', 'matplotlib'} & set(sys.modules))) or None)")
    result = subprocess.run([sys.executable, "-c", check], cwd=REPO / "workflow", capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_gather_times_the_run_from_first_start_to_last_end():
    plan = Plan("p1", "in.parquet", (), 300, ((0, 100), (100, 200), (200, 300)), (900, 900, 900), ((), (), ()))
    lengths = {"10": 60, "32": 40}
    shards = [ShardFile(i, f"{i}.parquet", 100, None, shard_stats(1.0 + i, 1000.0 + 5 * i, lengths=lengths), "sha256:0")
              for i in range(3)]
    run = run_facts(plan, shards, {"task": "classify", "path": "/m", "adapter": None, "max_length": 32})
    assert (run["started"], run["ended"], run["wall_s"]) == (1000.0, 1015.0, 15.0)  # shard 2: starts 1010, 3 s + 2 s
    assert run["rows_per_s"] == 20.0 and run["real_tokens_per_s"] == 200.0
    assert run["devices"] == ["cpu (1 threads)"] and run["dtype"] == "float32" and run["truncated"] == 3
    assert token_lengths(shards) == {"10": 180, "32": 120}


def test_gather_sums_the_tasks_running_totals_and_rates_them_over_the_wall_time():
    """Reporting.totals (generate's generated tokens): in all, and what the jobs that finished the shards
    made of them per second (a resumed shard's kept windows excluded); none for a task without."""
    plan = Plan("p1", "in.parquet", (), 200, ((0, 100), (100, 200)), (900, 900), ((), ()))
    stats = [{**shard_stats(1.0, 1000.0), "generated_tokens": 600},
             {**shard_stats(1.0, 1007.0), "generated_tokens": 400, "resumed_generated_tokens": 100}]
    shards = [ShardFile(i, f"{i}.parquet", 100, None, stats[i], "sha256:0") for i in range(2)]
    run = run_facts(plan, shards, {"task": "generate"})
    assert run["wall_s"] == 10.0 and (run["generated_tokens"], run["generated_tokens_per_s"]) == (1000, 90.0)
    assert "generated_tokens" not in run_facts(plan, shards, {"task": "classify"})


def test_gather_leaves_rates_out_when_a_shard_predates_the_timings():
    plan = Plan("p1", "in.parquet", (), 100, ((0, 100),), (900,), ((),))
    run = run_facts(plan, [ShardFile(0, "0.parquet", 100, None, {"rows": 100, "seconds": 1.0}, "sha256:0")], {})
    assert run["wall_s"] is None and run["rows_per_s"] is None and run["rows"] == 100


def test_a_shards_rate_excludes_its_model_load():
    shard = made_up_summary()["per_shard"][1]
    assert rows_per_s(shard) == 25.0 and load_seconds(shard) == 2.0
    assert rows_per_s({"rows": 0, "seconds": 0.0}) is None and load_seconds({"rows": 5}) is None


def test_cells_read_as_numbers():
    shown = [show(v) for v in (None, 1234567, 12.3456, 1.0037, 98765.4, "cpu")]
    assert shown == ["—", "1,234,567", "12.35", "1.004", "98,765", "cpu"]


def test_tables_list_every_shard_and_escape_text():
    summary = made_up_summary()
    rows = table_rows(html_table("Shards", shard_rows(summary), SHARD_COLUMNS))
    assert [row[0] for row in rows] == ["0", "1", "2"] and all(len(row) == len(SHARD_COLUMNS) for row in rows)
    assert rows[1][1:3] == ["[100, 200)", "100"] and rows[1][5] == "25"
    page = html_table("Run", run_rows(summary))
    assert "/lora &lt;a&gt;" in page and "<a>" not in page
    assert ["rows/s over the wall time", "30"] in table_rows(page)


def test_every_item_is_written(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(made_up_summary()))
    write_report(str(tmp_path / "summary.json"), report_files(tmp_path / "report"))
    for name in ITEMS[2:]:
        assert png_size(tmp_path / "report" / name) == PNG_SIZE, name
    assert len(table_rows((tmp_path / "report" / "shards.html").read_text())) == 3


def test_many_shards_and_missing_timings_still_draw(tmp_path):
    summary = made_up_summary(MAX_BARS + 1)
    for shard in summary["per_shard"][:5]:  # shard files kept from before the timings existed
        for key in ("stages", "started", "ended"):
            shard.pop(key)
    summary["token_lengths"] = {}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    write_report(str(tmp_path / "summary.json"), report_files(tmp_path / "report"))
    assert png_size(tmp_path / "report" / "stages.png") == PNG_SIZE


def test_a_summary_from_before_the_report_is_refused(tmp_path):
    summary = made_up_summary()
    del summary["run"]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(UserError, match=r"no `run` block.*--forcerun gather"):
        write_report(str(tmp_path / "summary.json"), report_files(tmp_path / "report"))


@pytest.fixture(scope="module")
def reported(classify_runs, tmp_path_factory) -> Path:
    """A copy of the shared 1000-row, 4-shard classify run (other workers read the original), then
    `snakemake --report report.zip` in it."""
    workdir = tmp_path_factory.mktemp("reported")
    shutil.copytree(classify_runs(ROWS, SHARDS).workdir, workdir, dirs_exist_ok=True, symlinks=True)
    command, env = prepare_workdir(workdir, yaml.safe_load((workdir / "config" / "config.yaml").read_text()),
                                   report=True)
    result = patience.run([*command, "--report", "report.zip"], [workdir], cwd=workdir, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return workdir


@pytest.mark.e2e
def test_summary_times_the_run(reported):
    summary = json.loads((reported / "results" / "summary.json").read_text())
    run, shards = summary["run"], summary["per_shard"]
    assert (run["rows"], run["shards"], run["task"], run["max_length"]) == (ROWS, SHARDS, "classify", 32)
    assert run["rows_per_s"] > 0 and run["real_tokens_per_s"] > 0
    assert run["wall_s"] >= max(s["seconds"] for s in shards) and run["started"] == min(s["started"] for s in shards)
    for shard in shards:
        assert set(shard["stages"]) == {"read", "tokenize", "batch", "device", "write"}, shard["stages"]
        assert shard["stages"]["device"] > 0 and shard["started"] < shard["ended"]
    lengths = {int(n): rows for n, rows in summary["token_lengths"].items()}
    assert sum(lengths.values()) == ROWS and max(lengths) == 32  # some texts are cut at max_length
    assert sum(n * rows for n, rows in lengths.items()) == run["real_tokens"]


@pytest.mark.e2e
def test_report_zip_holds_every_item(reported):
    """Snakemake's zip: report/report.html, and each item under report/data/raw/<id>/<file name>."""
    from matplotlib.image import imread

    with zipfile.ZipFile(reported / "report.zip") as report:
        items = {Path(name).name: name for name in report.namelist() if name.startswith("report/data/raw/")}
        assert sorted(items) == sorted(ITEMS)
        page = report.read("report/report.html").decode()
        shards_page = report.read(items["shards.html"]).decode()
        figure = report.read(items["rows_per_s.png"])
    assert "gather" in page and "Text lengths" in page  # the workflow description, a subcategory
    assert png_size(figure) == PNG_SIZE
    pixels = imread(io.BytesIO(figure))  # drawn, not blank: bars, axes and text in several colours
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 10
    plan = json.loads((reported / "results" / "plan.json").read_text())
    rows = table_rows(shards_page)
    assert [int(row[2].replace(",", "")) for row in rows] == [s["rows"] for s in plan["shards"]]
    assert sum(int(row[2].replace(",", "")) for row in rows) == ROWS


def custom_summary() -> dict:
    """The made-up summary as a custom task's: costs in cost units, not texts in tokens."""
    summary = made_up_summary()
    summary["run"]["task"] = "custom"
    return summary


def test_report_items_fit_the_task(tmp_path):
    """A custom task's rows are no texts: no token-length figure, no tokens or padding in its tables;
    a text task (classify) keeps them."""
    for summary, tokens in ((made_up_summary(), True), (custom_summary(), False)):
        facts = [what for what, _ in run_rows(summary)]
        assert ("padding ratio (tokens computed / real tokens)" in facts) is tokens
        assert ("real tokens/s over the wall time" in facts) is tokens and "rows/s over the wall time" in facts
        columns = shard_columns(summary)
        assert ("padding ratio" in columns) is tokens and ("real tokens" in columns) is tokens
        assert all(len(row) == len(columns) for row in shard_rows(summary))
    assert shard_columns(made_up_summary()) == SHARD_COLUMNS
    (tmp_path / "summary.json").write_text(json.dumps(custom_summary()))
    files = report_files(tmp_path / "report")
    write_report(str(tmp_path / "summary.json"), ReportFiles(**{**vars(files), "token_lengths": None}))
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == sorted(set(ITEMS) - {"token_lengths.png"})
    assert "padding ratio" not in (tmp_path / "report" / "shards.html").read_text()
