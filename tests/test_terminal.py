"""What a user reads on the terminal: the run summary lines and a shard's progress lines."""

from __future__ import annotations

import logging

from shardinfer.report.terminal import run_first_rows, summary_lines
from shardinfer.shard.progress import Progress, eta

SUMMARY = {
    "rows": 1000, "shards": 4, "truncated": 3, "model": {"max_length": 32},
    "per_shard": [{"first_truncated_rows": [7, 2]}, {"first_truncated_rows": []}, {"first_truncated_rows": [901]},
                  {"first_truncated_rows": None}],
    "run": {"rows_per_s": 123.45, "real_tokens_per_s": 4567.8, "wall_s": 8.1, "padding_ratio": 1.04,
            "devices": ["cuda (CUDA_VISIBLE_DEVICES=0, H200)"], "dtype": "bfloat16", "max_length": 32},
}


def test_summary_says_rows_where_speed_and_truncated_rows():
    lines = summary_lines(SUMMARY, "results/predictions.parquet", "results/summary.json")
    assert lines[0].startswith("shardinfer: 1,000 rows written to results/predictions.parquet")
    assert "4 shards, index 0..999" in lines[0]
    assert "123.5 rows/s, 4,568 tokens/s over 8.1 s" in lines[1] and "bfloat16" in lines[1]
    truncated = next(line for line in lines if "truncated" in line)
    assert "WARNING 3 of 1,000 texts were longer than max_length=32" in truncated
    assert "(first rows: 2, 7, 901)" in truncated and "results/summary.json" in truncated
    assert not any("no GPU" in line for line in lines)
    assert lines[-1].endswith("snakemake --report report.zip")


def test_the_first_rows_are_the_runs_not_each_shards():
    # shard 0 counted 12 truncated texts but lists its first 10: rows 10 and 11 of it come before
    # any of shard 1's, so shard 1's rows (500, 501) are not among the run's first
    shards = [{"first_truncated_rows": list(range(10)), "truncated": 12},
              {"first_truncated_rows": [500, 501], "truncated": 2}]
    assert run_first_rows(shards, "first_truncated_rows", "truncated", wanted=10) == list(range(10))
    assert run_first_rows(shards[:1] + shards, "first_truncated_rows", "truncated", wanted=12) == list(range(10))
    shards[0] = {"first_truncated_rows": [3, 1], "truncated": 2}  # all listed: the next shard's follow
    assert run_first_rows(shards, "first_truncated_rows", "truncated") == [1, 3, 500, 501]


def test_a_cpu_only_run_is_a_warning_and_no_truncation_no_line():
    summary = {**SUMMARY, "truncated": 0, "run": {**SUMMARY["run"], "devices": ["cpu (4 threads)"]}}
    lines = summary_lines(summary, "p.parquet", "s.json")
    assert any("WARNING no GPU was used" in line for line in lines)
    assert not any("truncated" in line for line in lines)


def test_progress_logs_the_first_write_then_once_per_interval_and_the_last(caplog):
    now = [0.0]
    progress = Progress(1000, interval_s=30, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="shardinfer.shard.progress"):
        for _ in range(10):  # 100 rows every 5 s
            now[0] += 5
            progress.advance(100)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "rows 100/1000 (10%), 20 rows/s, ETA 45 s"
    assert lines[1].startswith("rows 700/1000 (70%)") and lines[-1].startswith("rows 1000/1000 (100%)")
    assert len(lines) == 3


def test_eta_reads_like_a_person_would_say_it():
    assert [eta(s) for s in (4.4, 125, 12_000)] == ["4 s", "2 min 5 s", "3 h 20 min"]


def two_runs_summary() -> dict:
    """3 shards: shards 0 and 2 made by an earlier run (it failed on shard 1 at 1,000 s), shard 1
    by this run, which began at 5,000 s: 20 rows in 2 s of its job."""
    per_shard = [{"rows": 10, "real_tokens": 100, "started": 1000.0, "ended": 1003.0, "first_truncated_rows": []},
                 {"rows": 20, "real_tokens": 300, "started": 5001.0, "ended": 5003.0, "first_truncated_rows": []},
                 {"rows": 10, "real_tokens": 100, "started": 1001.0, "ended": 1004.0, "first_truncated_rows": []}]
    run = {**SUMMARY["run"], "task": "classify", "rows_per_s": 0.01, "real_tokens_per_s": 0.1, "wall_s": 4003.0}
    return {**SUMMARY, "rows": 40, "shards": 3, "truncated": 0, "per_shard": per_shard, "run": run}


def test_after_a_partial_rerun_the_speed_is_this_runs_shards():
    """The rate spans the shard jobs of this run, not the kept shards' earlier run, and says so."""
    lines = summary_lines(two_runs_summary(), "p.parquet", "s.json", since=5000.0)
    assert ("shardinfer: 1 of 3 shards ran in this run (2 kept from earlier runs): 10.0 rows/s, 150 tokens/s "
            "over 2.0 s of this run's shard jobs (first start to last end); padding ratio 1.04") in lines[1]
    everything = summary_lines(two_runs_summary(), "p.parquet", "s.json", since=900.0)
    assert "0.0 rows/s, 0 tokens/s over 4,003.0 s of shard jobs (first start to last end)" in everything[1]
    only_gather = summary_lines(two_runs_summary(), "p.parquet", "s.json", since=6000.0)
    assert "no shard job ran in this run (3 kept from earlier runs" in only_gather[1]


def test_a_custom_task_has_no_tokens_or_padding_on_the_terminal():
    summary = {**SUMMARY, "truncated": 0, "run": {**SUMMARY["run"], "task": "custom"}}
    line = summary_lines(summary, "p.parquet", "s.json")[1]
    assert "123.5 rows/s over 8.1 s" in line and "tokens" not in line and "padding" not in line


def test_a_tasks_running_totals_are_rates_on_the_terminal_the_run_wide_and_this_runs():
    """Reporting.totals: generate's generated tokens, per second over the run, and over this run's shard
    jobs after a partial rerun (a resumed job's own work: its total less what its kept windows brought)."""
    summary = {**SUMMARY, "run": {**SUMMARY["run"], "task": "generate", "generated_tokens_per_s": 76.54}}
    assert "4,568 tokens/s, 76.5 generated tokens/s over 8.1 s" in summary_lines(summary, "p.parquet", "s.json")[1]
    rerun = two_runs_summary()
    rerun["run"]["task"] = "generate"
    rerun["per_shard"][1].update(generated_tokens=90, resumed_generated_tokens=30)
    line = summary_lines(rerun, "p.parquet", "s.json", since=5000.0)[1]
    assert "10.0 rows/s, 150 tokens/s, 30.0 generated tokens/s over 2.0 s of this run's shard jobs" in line
    classify = summary_lines({**summary, "run": {**summary["run"], "task": "classify"}}, "p.parquet", "s.json")[1]
    assert "generated" not in classify  # classify declares no such total
