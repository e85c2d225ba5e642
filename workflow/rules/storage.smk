# Without a shared filesystem (docs/storage.md): what the main Snakemake
# process does in the bucket for its jobs, which see only their own declared files. `STORAGE` is in
# common.smk, the rules' storage inputs and outputs in shardinfer.snakefile.layout; the Snakefile calls these
# from onstart, onsuccess and onerror. Each does nothing on a shared filesystem.


def written_in_this_run(path):
    """Where this process reads `path`, a file written since this run started: the file itself, or
    without a shared filesystem its copy retrieved from storage; None when it is older or absent.
    """
    if not STORAGE:
        fresh = os.path.isfile(path) and os.path.getmtime(path) >= STARTED
        return path if fresh else None
    stored = workflow.storage_registry.default_storage_provider.object(
        LAYOUT.stored_at(path)
    )
    if not workflow.async_run(stored.managed_exists()):
        return None
    if workflow.async_run(stored.managed_mtime()) < STARTED:
        return None
    workflow.async_run(stored.managed_retrieve())
    return str(stored.local_path())


def print_failed_logs_from_storage(main_logs):
    """Without a shared filesystem, the log of a failed job is uploaded to storage, where this process
    does not look (show-failed-logs says "Logfile ... not found"): fetch each one that the run's
    log (`main_logs`: Snakemake's log files of this run) names for a failed job and put it on the
    terminal, so its one-line ERROR is seen.
    """
    if not STORAGE:
        return
    text = "".join(Path(path).read_text() for path in main_logs if os.path.isfile(path))
    lines = (
        line
        for line in text.splitlines()
        if line.strip().startswith("log:") and "check log" in line
    )
    failed = [
        query
        for line in lines
        for query in re.findall(r"(\S+) \(send to storage\)", line)
    ]
    provider = workflow.storage_registry.default_storage_provider
    for query in dict.fromkeys(failed):
        stored = provider.object(query)
        if not workflow.async_run(stored.managed_exists()):
            continue
        workflow.async_run(stored.managed_retrieve())
        logger.error(
            f"Log of the failed job, {query}:\n{stored.local_path().read_text()}"
        )


def remove_outdated_from_storage():
    """Without a shared filesystem, the plan and shard jobs cannot remove the table they outdate
    (`Layout.outdated`: they see no bucket). So this process does, before any job runs, for each
    input whose plan, tokenize or shard jobs this run is about to rerun: a run that fails after it
    never leaves the previous table in the bucket as if it were current. In the parts layout the
    shard jobs write the parts themselves: a replanned input's parts are all removed (its shard jobs
    all rerun; parts of a plan with another shard count would stay beside the new ones).
    """
    if not STORAGE:
        return
    needed = workflow.dag.needrun_jobs()
    rerun = {
        job.wildcards.get("name")
        for job in needed
        if job.rule.name in ("plan", "tokenize", "infer")
    }
    replanned = {job.wildcards.get("name") for job in needed if job.rule.name == "plan"}
    provider = workflow.storage_registry.default_storage_provider
    remove_stale_from_storage(provider, needed)
    for name in sorted(rerun, key=str):
        paths = [
            *LAYOUT.outdated({"name": name}),
            *LAYOUT.also_outdated({"name": name}),
        ]
        if LAYOUT.stored_parts and name in replanned:
            paths += stored_parts_of(provider, name)
        for path in paths:
            stored = provider.object(LAYOUT.stored_at(path))
            if workflow.async_run(stored.managed_exists()):
                logger.info(
                    f"shardinfer: removed {LAYOUT.stored_at(path)}, outdated by this run"
                )
                workflow.async_run(stored.managed_remove())


def remove_stale_from_storage(provider, needed):
    """For each input whose gather this run reruns, the files of an earlier run's writers that this
    run's do not write (a writer switched off: Layout.stale), which the gather job cannot see.
    """
    gathered = {
        job.wildcards.get("name") for job in needed if job.rule.name == "gather"
    }
    for name in sorted(gathered, key=str):
        for path in LAYOUT.stale({"name": name}):
            stored = provider.object(LAYOUT.stored_at(path))
            if not path.endswith("/") and workflow.async_run(stored.managed_exists()):
                logger.info(
                    f"shardinfer: removed {LAYOUT.stored_at(path)}, no longer written"
                )
                workflow.async_run(stored.managed_remove())


def stored_parts_of(provider, name):
    """The objects in the bucket under the parts folder of the input `name`, as result paths."""
    folder = fill(LAYOUT.table, name=name).rstrip("/")
    top = provider.object(STORAGE_PREFIX)
    return [path for path in object_names(top, folder)]
