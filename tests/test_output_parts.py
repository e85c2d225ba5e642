"""output.layout parts, without Snakemake: shard jobs that roll over into pieces at the part size,
gather that proves them by their metadata, index columns and records and links them into a folder
with a manifest, and the verifier that proves such a folder on its own, naming each tampering in
one line. (The end-to-end runs, the readers and the bucket: tests/test_output_runs.py, test_storage.py.)"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from factory import gather_job, input_frame, input_settings, write_input
from shardinfer.contract.pieces import PIECE_KEY, first_piece_data, later_pieces, read_record, record_path
from shardinfer.core.errors import ProofError, UserError
from shardinfer.plan.plan_file import run_plan
from shardinfer.proof.gather import run_gather
from shardinfer.proof.manifest import MANIFEST_NAME, part_names
from shardinfer.proof.verify import damage, main, verify_folder
from shardinfer.settings.config import BatchSettings, ModelSettings, OutputSettings, Settings, parse_size
from shardinfer.shard.job import run_shard
from shardinfer.shard.runtime import ShardJob
from shardinfer.snakefile.configure import output_settings

ROWS, SHARDS, DIGEST = 40, 2, "digest-a"


def pieces_of(paths: list[str]) -> list[Path]:
    """Every shard's pieces, in index order."""
    return [piece for path in paths for piece in [Path(path), *later_pieces(path)]]


def make_shards(models, root: Path, part_bytes: int | None) -> tuple:
    """A plan and its shard files; with `part_bytes`, each shard in pieces (one per window of 8 rows)."""
    inp = input_settings(write_input(input_frame(ROWS), root / "in.parquet"), keep_columns=("id", "gold"))
    model = ModelSettings(path=str(models.classifier), adapter=None, task="classify", max_length=32, dtype="auto",
                          trust_remote_code=False, allow_pickle=False)
    settings = Settings(input=inp, model=model, batch=BatchSettings(256, 16, 8), shards=SHARDS)
    run_plan(inp, SHARDS, 32, str(root / "plan.json"))
    paths = [str(root / "shards" / f"{shard}.parquet") for shard in range(SHARDS)]
    for shard, path in enumerate(paths):
        run_shard(ShardJob(settings, str(root / "plan.json"), shard, path, DIGEST, part_bytes=part_bytes))
    return inp, paths


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory):
    """The same shards twice: in pieces (a new one at every window), and each in one file."""
    pieces, whole = tmp_path_factory.mktemp("pieces"), tmp_path_factory.mktemp("whole")
    return {"pieces": (pieces, *make_shards(models, pieces, part_bytes=1)),
            "whole": (whole, *make_shards(models, whole, part_bytes=None))}


def gather(root: Path, inp, paths, layout: str, out: str = "out") -> dict:
    table = root / out / ("predictions" if layout == "parts" else "predictions.parquet")
    return run_gather(gather_job(root / "plan.json", paths, inp, {"task": "classify"}, DIGEST, table,
                                 root / out / "summary.json", output=OutputSettings(layout=layout)))


def copy_run(run, target: Path) -> tuple:
    """A copy of a run's folder (links as links), and its inputs there: a run a test may change."""
    root, inp, paths = run
    shutil.copytree(root, target, symlinks=True, dirs_exist_ok=True)
    return target, input_settings(target / "in.parquet", keep_columns=("id", "gold")), \
        [str(target / Path(path).relative_to(root)) for path in paths]


def test_a_shard_job_rolls_over_into_pieces_at_window_boundaries_with_a_record(runs):
    root, _, paths = runs["pieces"]
    shard = Path(paths[0])
    assert shard.is_symlink() and shard.resolve() == first_piece_data(shard).resolve()
    pieces = [shard, *later_pieces(shard)]
    rows = pq.read_metadata(runs["whole"][2][0]).num_rows
    # windows of 1, then 8 rows: a new piece before each but the first
    assert len(pieces) == 1 + -(-(rows - 1) // 8) > 2
    first = [json.loads(pq.read_metadata(path).metadata[PIECE_KEY]) for path in pieces]
    assert [place["piece"] for place in first] == [0, 1, 2, 3]
    record = read_record(record_path(shard))
    assert [p["name"] for p in record["pieces"]] == [path.name for path in pieces]
    assert [p["rows"] for p in record["pieces"]] == [pq.read_metadata(path).num_rows for path in pieces]
    assert record["pieces"][0]["stat"]["ino"] == os.stat(shard).st_ino  # the data's, through the link
    whole = pq.read_table(runs["whole"][2][0])
    assert pa.concat_tables(pq.read_table(path) for path in pieces).equals(whole)


def test_gather_of_pieces_equals_gather_of_whole_shards_row_for_row(runs):
    tables = {}
    for name, (root, inp, paths) in runs.items():
        gather(root, inp, paths, "file", out=f"file-{name}")
        tables[name] = pq.read_table(root / f"file-{name}" / "predictions.parquet")
    assert tables["pieces"].equals(tables["whole"]) and tables["whole"].num_rows == ROWS


def test_gather_links_every_piece_into_a_folder_with_a_manifest_that_verifies(runs, tmp_path, caplog):
    root, inp, paths = copy_run(runs["pieces"], tmp_path / "run")
    report = gather(root, inp, paths, "parts")
    folder = root / "out" / "predictions"
    names, pieces = sorted(path.name for path in folder.glob("*.parquet")), pieces_of(paths)
    assert names == part_names(len(pieces)) and report["output"]["parts"] == len(pieces)
    manifest = verify_folder(str(folder))
    assert [part["name"] for part in manifest["parts"]] == names and manifest["rows"] == ROWS
    for part, piece in zip(names, pieces):  # the same file, not a copy
        assert os.stat(folder / part).st_ino == os.stat(piece).st_ino
    table = pa.concat_tables(pq.read_table(folder / name) for name in names)
    assert table.equals(pq.read_table(runs["whole"][0] / "file-whole" / "predictions.parquet").replace_schema_metadata(
        table.schema.metadata))
    caplog.set_level(logging.INFO)
    caplog.clear()
    gather(root, inp, paths, "parts")  # again: linking changed the ctimes, which gather recorded after
    assert "proof holds" in caplog.text and "changed since their job wrote them" not in caplog.text
    assert verify_folder(str(folder), plan_id=json.loads((root / "plan.json").read_text())["plan_id"])


def test_a_copied_run_is_proven_by_its_bytes_and_an_edited_piece_by_its_values(runs, tmp_path, caplog):
    """A copy has new inodes: the SHA-256 of each piece stands for its values. A piece edited in place with
    its size and mtime put back is refused by its values, and no folder is left."""
    caplog.set_level(logging.INFO)
    root, inp, paths = copy_run(runs["pieces"], tmp_path / "run")
    gather(root, inp, paths, "parts")
    assert "2 of 2 shards were changed since their job wrote them (copied, touched or linked): 2 have" in caplog.text
    piece = later_pieces(paths[1])[1]
    file, stat = pq.ParquetFile(piece), os.stat(piece)
    table = file.read()
    probs = table.column("probs").to_pylist()
    probs[0] = [p + 0.25 for p in probs[0]]
    column = table.schema.get_field_index("probs")
    edited = table.set_column(column, "probs", pa.array(probs, table.schema.field("probs").type))
    with pq.ParquetWriter(piece, table.schema, write_page_checksum=True) as writer:  # its metadata kept
        writer.write_table(edited)
        writer.add_key_value_metadata({k: v for k, v in file.metadata.metadata.items() if k != b"ARROW:schema"})
    os.utime(piece, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ProofError, match=r"shard 1 .*: its values are not those its job wrote") as caught:
        gather(root, inp, paths, "parts")
    assert "\n" not in str(caught.value) and not (root / "out" / "predictions").exists()


def test_a_piece_missing_or_one_its_job_did_not_write_is_refused(runs, tmp_path):
    root, inp, paths = copy_run(runs["pieces"], tmp_path / "run")
    later_pieces(paths[0])[-1].unlink()
    with pytest.raises(ProofError, match=r"shard 0 .*: piece `.*0\.3\.parquet` its job wrote is missing; rerun"):
        gather(root, inp, paths, "file")
    root, inp, paths = copy_run(runs["pieces"], tmp_path / "again")
    shutil.copy(later_pieces(paths[0])[-1], Path(paths[0]).with_name("0.4.parquet"))
    with pytest.raises(ProofError, match=r"shard 0 .*: `.*0\.4\.parquet` is not a piece its job wrote; remove it"):
        gather(root, inp, paths, "file")


@pytest.fixture(scope="module")
def folder(runs, tmp_path_factory) -> Path:
    """A proven folder of parts (a part per piece of two shards), copied by each test that tampers with it."""
    root, inp, paths = copy_run(runs["pieces"], tmp_path_factory.mktemp("folder"))
    gather(root, inp, paths, "parts")
    return root / "out" / "predictions"


def name(folder: Path, k: int) -> str:
    """The folder's k-th part (-1: its last)."""
    return sorted(path.name for path in folder.glob("*.parquet"))[k]


def tampered(folder: Path, tmp_path: Path, change) -> Path:
    """A plain copy of the folder elsewhere (as a user copies it), changed by `change(copy)`."""
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    change(copy)
    return copy


def edit_in_place(copy: Path) -> None:
    """One byte of a part's data changed; same size, the file still Parquet."""
    path = copy / name(copy, 2)
    data = bytearray(path.read_bytes())
    data[10] ^= 0x01
    path.write_bytes(bytes(data))


def swap(first: int, second: int):
    """Two parts' names swapped (a copy script that mixed them up)."""
    def change(copy: Path) -> None:
        a, b = copy / name(copy, first), copy / name(copy, second)
        a.rename(copy / "swapping")
        b.rename(a)
        (copy / "swapping").rename(b)
    return change


def stale_manifest(copy: Path) -> None:
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    (copy / MANIFEST_NAME).write_text(json.dumps({**manifest, "plan_id": "0123456789abcdef"}))


@pytest.mark.parametrize("change, message", [
    (lambda copy: (copy / name(copy, 3)).unlink(),
     r"part `part-00003-of-000\d\d.parquet` is missing \(rows \[\d+, \d+\); 1 missing\)"),
    (lambda copy: (copy / "part-00099-of-00099.parquet").write_bytes(b"PAR1"),
     r"`part-00099-of-00099.parquet` is not a part its manifest names \(an extra file"),
    (lambda copy: (copy / "_SUCCESS").write_bytes(b""), r"`_SUCCESS` is not a part its manifest names"),
    (lambda copy: (copy / name(copy, 5)).rename(copy / "part-5.parquet"),
     r"part `part-00005-of-000\d\d.parquet` was renamed to `part-5.parquet`"),
    (lambda copy: (copy / name(copy, 1)).write_bytes((copy / name(copy, 1)).read_bytes()[:-100]),
     r"part `part-00001-of-000\d\d.parquet` has \d+ bytes, its manifest \d+: truncated"),
    (swap(1, 2), r"part `part-00001-of-000\d\d.parquet` holds rows \[(\d+), (\d+)\) where rows \[\d+, \1\) were "
                  r"expected, the rows of part `part-00002-of-000\d\d.parquet`: parts swapped or copied over one "
                  r"another$"),
    (swap(0, -1), r"part `part-00000-of-000\d\d.parquet` holds rows \[\d+, 40\) where rows \[0, \d+\) were expected, "
                  r"the rows of part `part-000\d\d-of-000\d\d.parquet`: parts swapped"),
    (edit_in_place, r"part `part-00002-of-000\d\d.parquet` is not the file its manifest names \(SHA-256 differs\): "
                    r"edited"),
    (stale_manifest, r"part `part-00000-of-000\d\d.parquet` was made under plan \w+ \(settings digest-a\), its "
                     r"manifest names plan 0123456789abcdef .*: the manifest is stale"),
])
def test_the_verifier_names_each_tampering_in_one_line(folder, tmp_path, change, message):
    assert verify_folder(str(folder))["rows"] == ROWS
    copy = tampered(folder, tmp_path, change)
    with pytest.raises(ProofError, match=message) as caught:
        verify_folder(str(copy))
    assert "\n" not in str(caught.value)


def test_the_verifier_command_says_what_it_checked_and_refuses_another_plans_folder(folder, capsys):
    plan = folder.parents[1] / "plan.json"
    assert main([str(folder), "--plan", str(plan)]) == 0
    out = capsys.readouterr().out
    parts = len(list(folder.glob("*.parquet")))
    assert f"verified {folder}: {parts} parts, {ROWS} rows" in out and "names, sizes, footers and SHA-256" in out
    other = folder.parents[1] / "other-plan.json"
    other.write_text(json.dumps({"plan_id": "fedcba9876543210"}))
    assert main([str(folder), "--plan", str(other), "--quick"]) == 1
    assert "stale; rerun the workflow" in capsys.readouterr().err


def test_a_damaged_folder_is_told_by_names_and_sizes_alone(folder, tmp_path):
    assert damage(str(folder)) is None
    assert damage(str(tmp_path)) is None  # no manifest: nothing to withdraw
    copy = tampered(folder, tmp_path, lambda copy: (copy / name(copy, -1)).unlink())
    assert f"part `{name(folder, -1)}` is missing" in damage(str(copy))


def test_a_part_size_is_bytes_or_a_number_with_a_unit_else_refused_in_one_line():
    assert [parse_size(v) for v in ("512MB", "1.5GiB", "2 GB", 1000, "64kb")] == [
        512 * 10**6, int(1.5 * 2**30), 2 * 10**9, 1000, 64 * 10**3]
    for bad in ("12XB", "MB", "-3MB", 0, True, "1e9"):
        with pytest.raises(UserError, match=r"config `output.part_size`: .* is not a size; give bytes") as caught:
            output_settings({"layout": "parts", "part_size": bad})
        assert "\n" not in str(caught.value)


def verify_command(url: str, *args: str, env: dict) -> list[str]:
    """scripts/verify.py on `url` as a user runs it, its stderr lines (its exit status 1)."""
    import subprocess
    import sys

    import plugins
    from factory import REPO, python_env

    result = subprocess.run([sys.executable, str(REPO / "scripts" / "verify.py"), url, *args], capture_output=True,
                            text=True, timeout=120, env=plugins.with_plugins(python_env(**env)))
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stderr.splitlines()


@pytest.mark.parametrize("keys, says", [
    ({}, "ERROR no credentials to read `s3://bucket/run/results/predictions/` in the S3 storage at {endpoint}: set "
         "SNAKEMAKE_STORAGE_S3_ACCESS_KEY and SNAKEMAKE_STORAGE_S3_SECRET_KEY (profiles/s3)"),
    ({"SNAKEMAKE_STORAGE_S3_ACCESS_KEY": "key", "SNAKEMAKE_STORAGE_S3_SECRET_KEY": "secret"},
     "ERROR the S3 storage at {endpoint} is out of reach reading `s3://bucket/run/results/predictions/` (Could not "
     "connect to the endpoint URL: "),
])
def test_the_verifier_says_a_bucket_without_credentials_or_out_of_reach_in_one_line(tmp_path, monkeypatch, keys,
                                                                                      says):
    """As the workflow says the same failures (shardinfer.input.bucket.storage_refusal), naming the fix:
    not 40-90 lines of botocore's traceback. Nothing listens on the endpoint; without credentials
    boto3 stops before it sends a request."""
    import plugins
    from s3_server import free_port

    plugins.importable()
    pytest.importorskip("boto3")  # beside the venv with the S3 storage plugin (tests/install-plugins)
    for variable in [key for key in os.environ if key.startswith(("SNAKEMAKE_STORAGE_S3_", "AWS_"))]:
        monkeypatch.delenv(variable)
    endpoint = f"http://127.0.0.1:{free_port()}"
    nowhere = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
               "AWS_EC2_METADATA_DISABLED": "true"}
    lines = verify_command("s3://bucket/run/results/predictions/", "--endpoint-url", endpoint, env={**nowhere, **keys})
    assert len(lines) == 1 and lines[0].startswith(says.format(endpoint=endpoint)), lines
    if keys:
        assert lines[0].endswith("; check --endpoint-url (or $SNAKEMAKE_STORAGE_S3_ENDPOINT_URL) and that the server "
                                 "runs"), lines


def test_pieces_keep_to_the_part_size_unless_one_window_alone_is_larger(tmp_path):
    """A new piece starts before a window that would take the open one past output.part_size (its
    bytes foreseen from the windows before it): parts came out up to 2x the size asked (794 kB at
    400 kB) when a piece just under the size took one more window. A piece holds a window at least."""
    import numpy as np

    from shardinfer.shard.pieces import ShardPieces

    rng = np.random.default_rng(0)

    def window(rows: int) -> pa.Table:
        return pa.table({"index": pa.array(range(rows), pa.int64()),
                         "vector": [rng.random(8).astype(np.float32) for _ in range(rows)]})

    windows = [window(1000 + 37 * k) for k in range(10)]  # ~38-51 kB each on disk
    for part_bytes, pieces_at_least in ((120_000, 4), (60_000, 10), (30_000, 10)):
        pieces = ShardPieces(tmp_path / f"{part_bytes}.parquet", windows[0].schema, 0, part_bytes)
        for table in windows:
            pieces.write_table(table)
        pieces.finish({})
        sizes = [path.stat().st_size for path in pieces.partials]
        if part_bytes > 60_000:
            assert max(sizes) <= part_bytes, sizes
        else:  # each window alone is larger than the part size: a piece each, no more
            assert len(sizes) == len(windows)
        assert len(sizes) >= pieces_at_least
