"""Load check: bytes read by 64 shards of a 1 GB input in each format, a 1,000,000-row input
through a tiny model on CPU in 64 shards, and a 10,000-shard plan's DAG. Prints wall times, the
gather step's peak memory, the proof, and the workflow's own overhead as a share of the wall time.

DAG: `snakemake -n` with --dag-shards shards, of the workflow and of a bare Snakefile with the same
rules and directives but trivial values (BARE_SNAKEFILE), in turns, best of two each; the ratio is
the workflow's own Snakemake overhead per shard job.

Bytes read: the script writes one table of about --read-gb GB in every input format (the registry,
`shardinfer.input.formats`, each by its own `Format.write`, in blocks of about 64 MiB), gzipped too
for each format that may be compressed, and as a Parquet file of one row group (what pandas writes);
it plans each into --shards ranges (staging the gzipped files and the one-group Parquet file, as the
plan rule does: `shardinfer.input.staging`) and reads every range as a shard job does
(`parts.iter_pieces` with the plan's spans, from the staged copy), in this process, counting what it
reads; a staged file is also read in place by all shards, as it would be without its copy. rchar
counts read calls: the pages a format reads memory-mapped (Arrow IPC, hf_dataset) are not in it.

Bytes downloaded: without a shared filesystem a shard job downloads the plan file and its own cut of
the input, which the plan writes (`shardinfer.input.shard_cuts`); for each format the script plans
the same file so, and prints each shard job's bytes and all of them together against the input;
then what each shard job downloads of the model besides (the demo's, as rule stage_model stages it).

Overhead is everything that is not shard work: wall time minus the shard jobs' summed time
(Snakemake's `benchmark:` of each infer job, start-up and model load included) divided by the
jobs that run at once (--cores 2, one thread per shard job). It holds plan, gather, the report
items, Snakemake's scheduling and job launching, and any idle slot at the end.

    .venv/bin/python scripts/load_check.py [workdir] [--rows N] [--shards K] [--read-gb G]
        [--dag-shards D] [--skip-run]

Builds its tiny model and input under `workdir` (default /tmp/shardinfer-load); nothing is downloaded.
"""

import argparse
import csv
import json
import resource
import subprocess
import time
from pathlib import Path

import tiny_workflow as tiny

REPO = Path(__file__).resolve().parents[1]


def timed(label: str, function, *args):
    started = time.perf_counter()
    result = function(*args)
    seconds = time.perf_counter() - started
    print(f"{label}: {seconds:.1f} s", flush=True)
    if hasattr(result, "returncode"):
        result.wall_s = seconds
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", nargs="?", default="/tmp/shardinfer-load", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--dag-shards", type=int, default=10_000, help="0 skips the DAG check")
    parser.add_argument("--read-gb", type=float, default=1.0, help="size of the bytes-read inputs; 0 skips them")
    parser.add_argument("--skip-run", action="store_true", help="skip the --rows workflow run")
    args = parser.parse_args()
    if args.read_gb:
        report_reads(args.workdir / "reads", args.read_gb, args.shards)
    if args.dag_shards or not args.skip_run:
        check_dag_and_run(args)


def check_dag_and_run(args: argparse.Namespace) -> None:
    models = timed("build tiny models", tiny.build_tiny_models, args.workdir / "models")
    if args.dag_shards:
        check_dag(args.workdir / "dag", models.classifier, args.dag_shards)

    if args.skip_run:
        return
    frame = tiny.input_frame(args.rows, seed=1)
    path = timed(f"write {args.rows} rows", tiny.write_input, frame, args.workdir / "run" / "data" / "input.parquet")
    config = tiny.workflow_config(path, models.classifier, shards=args.shards,
                                     batch={"max_tokens": 8192, "max_rows": 256, "sort_window": 16384})
    run = lambda: tiny.run_workflow(args.workdir / "run", config, timeout=4 * 3600)  # noqa: E731
    result = timed(f"workflow, {args.rows} rows, {args.shards} shards", run)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    table = tiny.read_predictions(args.workdir / "run")
    assert table["index"].tolist() == list(range(args.rows)) and table["id"].tolist() == frame["id"].tolist()
    print(f"proof re-checked here: {len(table)} rows, index 0..{args.rows - 1} in order, ids match the input")
    logs = args.workdir / "run" / "logs"
    gather = benchmark_of(logs / "gather.benchmark.tsv")
    print(f"gather: {float(gather['s']):.1f} s, peak RSS {float(gather['max_rss']):.0f} MB")
    report_overhead(args.workdir / "run", wall=result.wall_s, slots=2)


# The workflow's rules with the same directives and shapes (named inputs and outputs, log, benchmark,
# conda, threads, resources, params, script, a report item), each trivial: what Snakemake itself
# costs per job, against which the workflow's own overhead is measured.
BARE_SNAKEFILE = """\
SHARDS = int(config["shards"])
INPUT = config["input"]


wildcard_constraints:
    shard=r"\\d+",


rule all:
    input:
        "results/predictions.parquet",
        "results/report/run.html",


rule plan:
    input:
        table=INPUT,
    output:
        plan="results/plan.json",
        staged=directory("results/staged"),
    log:
        "logs/plan.log",
    benchmark:
        "logs/plan.benchmark.tsv"
    conda:
        "env.yaml"
    params:
        shards=SHARDS,
    script:
        "job.py"


rule infer:
    input:
        plan="results/plan.json",
        staged="results/staged",
    output:
        shard="results/shards/{shard}.parquet",
    log:
        "logs/infer/{shard}.log",
    benchmark:
        "logs/infer/{shard}.benchmark.tsv"
    conda:
        "env.yaml"
    threads: 4
    resources:
        gpu=1,
    params:
        settings={"batch": {"max_rows": 16}},
        digest="0123456789abcdef",
    script:
        "job.py"


rule gather:
    input:
        plan="results/plan.json",
        staged="results/staged",
        shards=expand("results/shards/{shard}.parquet", shard=range(SHARDS)),
    output:
        predictions="results/predictions.parquet",
        summary="results/summary.json",
    log:
        "logs/gather.log",
    benchmark:
        "logs/gather.benchmark.tsv"
    conda:
        "env.yaml"
    params:
        digest="0123456789abcdef",
    script:
        "job.py"


rule report_items:
    input:
        summary="results/summary.json",
    output:
        run=report("results/report/run.html", category="Run"),
    log:
        "logs/report.log",
    benchmark:
        "logs/report.benchmark.tsv"
    localrule: True
    conda:
        "env.yaml"
    script:
        "job.py"
"""


def dry_run(command: list[str], workdir: Path, env: dict) -> tuple[float, float]:
    """Wall and CPU seconds (the child's user + sys) of one `snakemake -n`."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def check_dag(workdir: Path, model: Path, shards: int, repeats: int = 2) -> None:
    """`snakemake -n` of the workflow and of BARE_SNAKEFILE with `shards` shards over the same input,
    run in turns `repeats` times each (best kept: the machine may be shared); prints both and their ratio."""
    path = tiny.write_input(tiny.input_frame(shards, seed=2), workdir / "data" / "input.parquet")
    ours, env = tiny.prepare_workdir(workdir / "ours", tiny.workflow_config(path, model, shards=shards), "-n", "-q")
    bare = workdir / "bare"
    bare.mkdir(parents=True, exist_ok=True)
    (bare / "Snakefile").write_text(BARE_SNAKEFILE)
    (bare / "job.py").write_text("from pathlib import Path\n\nfor path in snakemake.output:\n    Path(path).touch()\n")
    (bare / "env.yaml").write_text("channels: [conda-forge]\ndependencies: [python]\n")
    bare_command = [*ours[:ours.index("-s") + 1], str(bare / "Snakefile"), *ours[ours.index("-s") + 2:],
                    "--config", f"shards={shards}", f"input={path}"]
    runs = {"workflow": [], "bare": []}
    for _ in range(repeats):
        runs["workflow"].append(dry_run(ours, workdir / "ours", env))
        runs["bare"].append(dry_run(bare_command, bare, env))
    (wall, cpu), (bare_wall, bare_cpu) = (min(runs["workflow"]), min(runs["bare"]))
    print(f"snakemake -n with {shards} shards (best of {repeats}): workflow {wall:.1f} s wall, {cpu:.1f} s CPU; "
          f"bare Snakefile {bare_wall:.1f} s wall, {bare_cpu:.1f} s CPU; ratio {wall / bare_wall:.2f}x wall, "
          f"{cpu / bare_cpu:.2f}x CPU", flush=True)


def big_table(gigabytes: float, seed: int = 0):
    """About `gigabytes` of text in rows of 20 to 400 characters: random letters and spaces, with a
    comma, a quote or a newline now and then, so CSV quotes some values and JSONL escapes them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer((b"abcdefghijklmnopqrstuvwxyz" * 9 + b" " * 50)[:253] + b',"\n', np.uint8)  # 256
    lengths = rng.integers(20, 400, size=int(gigabytes * 1e9 / 210))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    chars = alphabet[rng.integers(0, 256, size=int(offsets[-1]), dtype=np.uint8)]
    text = pa.LargeStringArray.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(chars)).cast(pa.string())
    ids = pc.binary_join_element_wise("row-", pc.cast(pa.array(np.arange(len(lengths))), pa.string()), "")
    return pa.table({"id": ids, "text": text})


BLOCK_BYTES = 64 << 20  # the blocks each format is written in (row groups, batches, stripes)


def write_formats(folder: Path, gigabytes: float) -> dict[str, Path]:
    """The same table in every format (its own writer), each compressible one gzipped too, and a
    Parquet file of one row group (what pandas writes)."""
    import gzip
    import shutil

    from shardinfer.input.formats import all_formats, format_named

    table = big_table(gigabytes)
    folder.mkdir(parents=True, exist_ok=True)
    block_rows = max(1, table.num_rows * BLOCK_BYTES // max(table.nbytes, 1))
    paths = {}
    for fmt in all_formats().values():
        paths[fmt.name] = folder / f"input{fmt.extensions[0] if fmt.extensions else '-' + fmt.name}"
        fmt.write(table, str(paths[fmt.name]), block_rows)
        if fmt.compressible:
            paths[f"{fmt.name}.gz"] = packed = folder / f"{paths[fmt.name].name}.gz"
            with open(paths[fmt.name], "rb") as plain, gzip.open(packed, "wb", compresslevel=1) as sink:
                shutil.copyfileobj(plain, sink, 1 << 22)
    paths["parquet, one row group"] = folder / "one-group.parquet"
    format_named("parquet").write(table, str(paths["parquet, one row group"]), table.num_rows)
    return paths


def settings_of(path: Path):
    """The input settings of one written file or folder, its format and parts resolved."""
    from shardinfer.input.discovery import resolve_input
    from shardinfer.settings.config import InputSettings

    fmt, parts = resolve_input(str(path))
    return InputSettings(path=str(path), format=fmt, parts=parts, text_column="text", keep_columns=("id",),
                         null_text="error")


def size_of(path: Path) -> int:
    """A file's bytes, or a folder's files' together."""
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measured(figures: dict, name: str, function, *args):
    """Run `function`, recording the bytes it read (`<name>_bytes`) and its seconds (`<name>_s`)."""
    before, started = tiny.bytes_read(), time.perf_counter()
    result = function(*args)
    figures.update({f"{name}_bytes": tiny.bytes_read() - before, f"{name}_s": time.perf_counter() - started})
    return result


def read_all_shards(settings, plan) -> None:
    """Every shard's rows, one shard after another, as the shard jobs read them."""
    rows = sum(batch.num_rows for shard in range(plan.shards) for _, batch in plan.shard_rows(settings, shard))
    assert rows == plan.rows, (rows, plan.rows)


def read_like_the_shards(path: Path, shards: int) -> dict:
    """Plan the file into `shards` ranges (staging it where the shards could not read it by range,
    as the plan rule does by default), then read each range as its shard job does (from its span,
    or its row groups; from the staged copy if any); bytes read (page cache included) and seconds.
    A staged file is also read in place, all shards, as it would be without its copy."""
    import dataclasses
    import shutil

    from shardinfer.plan.plan_file import make_plan

    settings = settings_of(path)
    figures = {"size": size_of(path)}
    plan = measured(figures, "plan", make_plan, settings, shards, 512, str(path.parent / f"staged-{path.name}"))
    staged = plan.parts[0].staged
    figures.update(rows=plan.rows, staged=staged and staged.size)
    measured(figures, "shard", read_all_shards, settings, plan)
    if staged:
        in_place = dataclasses.replace(plan, parts=(dataclasses.replace(plan.parts[0], staged=None),))
        in_place = dataclasses.replace(in_place, pieces=tuple(
            tuple(dataclasses.replace(piece, part=in_place.parts[0]) for piece in pieces) for pieces in plan.pieces))
        measured(figures, "in_place", read_all_shards, settings, in_place)
    elif len(settings.files) == 1:  # a folder of parts: its last shard reads its own parts anyway
        measured(figures, "unspanned", read_last_from_the_start, settings, plan)
    shutil.rmtree(path.parent / f"staged-{path.name}")
    return figures


def read_last_from_the_start(settings, plan) -> None:
    """The last shard read from the file's start, as before spans (JSONL: with the types this process
    already knows; a shard job without its span also reads the whole file once more to type it)."""
    from shardinfer.input.formats import format_named
    from shardinfer.input.parts import one_file

    start, end = plan.ranges[-1]
    rows = format_named(settings.format).read_range(one_file(settings, settings.files[0]), start, end)
    assert sum(batch.num_rows for _, batch in rows) == end - start


def report_reads(folder: Path, gigabytes: float, shards: int) -> None:
    import shutil

    paths = timed(f"write {gigabytes:g} GB in every format, gzipped too, and as one-row-group parquet", write_formats,
                  folder, gigabytes)
    print(f"bytes read with {shards} shards (/proc/self/io rchar, page cache included; x = times the file's size; "
          "a staged file: times its copy's size, and in place times the file's):")
    for fmt, path in paths.items():
        f = read_like_the_shards(path, shards)
        size, read = f["size"], f["staged"] or f["size"]
        copy = f", staged a {f['staged'] / 1e9:.2f} GB copy" if f["staged"] else ""
        line = (f"  {fmt:9} {size / 1e9:.2f} GB, {f['rows']} rows: plan {f['plan_bytes'] / size:.2f}x in "
                f"{f['plan_s']:.1f} s (scan, digest{copy}); all {shards} shards {f['shard_bytes'] / read:.2f}x "
                f"in {f['shard_s']:.1f} s")
        if f["staged"]:
            line += (f"; read in place instead: {f['in_place_bytes'] / size:.2f}x in {f['in_place_s']:.1f} s "
                     f"({f['in_place_s'] / f['shard_s']:.1f}x the time)")
        elif "unspanned_bytes" in f:
            line += (f"; the last shard alone from the start, without its span: {f['unspanned_bytes'] / size:.2f}x "
                     f"in {f['unspanned_s']:.1f} s")
        print(line, flush=True)
    report_downloads(paths, shards)
    for path in paths.values():
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def report_downloads(paths: dict[str, Path], shards: int) -> None:
    """Without a shared filesystem, what each shard job downloads: the plan file and its own cut
    (`shardinfer.input.shard_cuts`), which the plan job writes as the plan rule does there."""
    import shutil

    from shardinfer.plan.plan_file import make_plan, write_plan

    print(f"bytes downloaded per shard job without a shared filesystem ({shards} shards: plan.json + its cut; "
          "x = all shard jobs together, times the input's size):")
    for fmt, path in paths.items():
        folder = path.parent / f"cuts-{path.name}"
        folder.mkdir(exist_ok=True)
        settings = settings_of(path)
        started = time.perf_counter()
        plan = make_plan(settings, shards, 512).write_cuts(settings, [str(folder / f"{k}.parquet")
                                                                      for k in range(shards)])
        seconds = time.perf_counter() - started
        write_plan(plan, str(folder / "plan.json"))
        plan_bytes, cuts = (folder / "plan.json").stat().st_size, sorted(cut.size for cut in plan.cuts)
        size = size_of(path)
        print(f"  {fmt:9} {size / 1e9:.2f} GB: per shard job {plan_bytes / 1e3:.0f} kB of plan + a cut of "
              f"{cuts[0] / 1e6:.1f}..{cuts[-1] / 1e6:.1f} MB (median {cuts[len(cuts) // 2] / 1e6:.1f}); all "
              f"{(shards * plan_bytes + sum(cuts)) / size:.2f}x; plan with cuts {seconds:.1f} s", flush=True)
        shutil.rmtree(folder)
    report_model_downloads(shards)


def report_model_downloads(shards: int) -> None:
    """Beside its rows, each shard job downloads the model's copies once (`shardinfer.snakefile.stored_model`):
    the demo's model's files, as rule stage_model stages them; a tokenize job the tokenizer's alone."""
    import yaml

    from shardinfer.core.errors import UserError
    from shardinfer.hf.tokenizer_files import is_tokenizer_side
    from shardinfer.snakefile.configure import resolve_model_path
    from shardinfer.snakefile.settings_digest import directory_fingerprint

    configured = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["model"]["path"]
    try:
        files = directory_fingerprint(resolve_model_path(configured))
    except UserError as error:  # the demo's model package is not installed here
        print(f"  the model: not measured ({error})")
        return
    model = sum(size for _, size, _ in files)
    tokenizer = sum(size for name, size, _ in files if is_tokenizer_side(name))
    print(f"  and the model's copies, once per shard job: the demo's {configured} is {model / 1e6:.1f} MB "
          f"({len(files)} files), {shards} shard jobs {shards * model / 1e9:.2f} GB in all; a tokenize job "
          f"{tokenizer / 1e6:.1f} MB (the tokenizer's files)", flush=True)



def benchmark_of(path: Path) -> dict:
    with open(path) as handle:
        return next(csv.DictReader(handle, delimiter="\t"))


def report_overhead(workdir: Path, wall: float, slots: int) -> None:
    """Wall time against the shard jobs' own time packed into `slots` concurrent jobs."""
    logs = workdir / "logs"
    plan_s = float(benchmark_of(logs / "plan.benchmark.tsv")["s"])
    gather_s = float(benchmark_of(logs / "gather.benchmark.tsv")["s"])
    report_s = float(benchmark_of(logs / "report.benchmark.tsv")["s"])
    jobs_s = sum(float(benchmark_of(p)["s"]) for p in (logs / "infer").glob("*.benchmark.tsv"))
    summary = json.loads((workdir / "results" / "summary.json").read_text())
    work_s = sum(s["seconds"] for s in summary["per_shard"])
    overhead = wall - jobs_s / slots
    print(f"wall {wall:.1f} s; shard jobs {jobs_s:.1f} s in all ({work_s:.1f} s of it reading, inferring and "
          f"writing, {jobs_s - work_s:.1f} s starting Python, loading the model), {slots} at a time")
    print(f"overhead (wall - shard jobs / {slots}): {overhead:.1f} s = {overhead / wall:.1%} of the wall time; "
          f"of it plan {plan_s:.1f} s, gather {gather_s:.1f} s, report items {report_s:.1f} s, "
          f"scheduling and idle {overhead - plan_s - gather_s - report_s:.1f} s")
    bounds = {}
    for shard in summary["per_shard"]:
        bounds[shard["bound_by"]] = bounds.get(shard["bound_by"], 0) + 1
    print(f"padding ratio {summary['padding_ratio']}; shards bound by: {bounds}")


if __name__ == "__main__":
    main()
