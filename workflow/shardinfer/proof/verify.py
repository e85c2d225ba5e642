"""Check a folder of parts against its manifest, on its own: where gather wrote it, a copy elsewhere,
or a bucket (`s3://bucket/prefix/results/predictions/`, through boto3 as Snakemake's S3 plugin
reaches it). No plan, input or workflow is needed.

    python scripts/verify.py results/predictions/              # every part's bytes read (SHA-256)
    python scripts/verify.py results/predictions/ --quick      # names and sizes only
    python scripts/verify.py s3://bucket/run/results/predictions/ --endpoint-url http://...
    python scripts/verify.py results/predictions/ --plan results/plan.json   # and of the current plan

A fault is one line naming it: a part missing, renamed, truncated or edited, a part holding another
part's rows (swapped), a file the manifest does not name (a reader would take it for data), parts
made under another plan than the manifest names (a stale manifest), a folder of another plan than
the one given; so is a bucket that refuses or is out of reach (the workflow's lines for them).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
from pathlib import Path
from typing import BinaryIO

import pyarrow.parquet as pq

from shardinfer.contract.file_digest import CHUNK_BYTES, DIGEST_ALGORITHM
from shardinfer.contract.pieces import PIECE_KEY
from shardinfer.contract.shard_file import IDENTITY_KEY
from shardinfer.core.errors import ProofError, UserError
from shardinfer.input.bucket import Reach, storage_refusal
from shardinfer.proof.manifest import MANIFEST_FORMAT, MANIFEST_NAME


class LocalFolder:
    def __init__(self, path: str):
        self.path = Path(path)
        self.where = str(path)

    def sizes(self) -> dict[str, int]:
        """Every entry a reader of the folder would take: its name (a folder's with `/`) and size."""
        return {entry.name + ("/" if entry.is_dir() else ""): entry.stat().st_size if entry.is_file() else 0
                for entry in self.path.iterdir()} if self.path.is_dir() else {}

    def read(self, name: str) -> bytes | None:
        path = self.path / name
        return path.read_bytes() if path.is_file() else None

    def open(self, name: str) -> BinaryIO:
        return open(self.path / name, "rb")


# The verifier's own options, for the fixes a refused request to the bucket names (the workflow's lines).
VERIFY_REACH = Reach(verb="read", endpoint_option="--endpoint-url (or $SNAKEMAKE_STORAGE_S3_ENDPOINT_URL)",
                     bucket_fix="check the folder's URL")


class BucketFolder:
    """A folder in an S3 bucket, through boto3: its listing, the manifest, ranged reads of the parts."""

    def __init__(self, url: str, endpoint_url: str | None = None):
        import boto3

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        self.bucket, self.prefix, self.where = bucket, prefix.rstrip("/") + "/", url
        self.endpoint = endpoint_url or os.environ.get("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL")
        self.client = boto3.client(
            "s3", endpoint_url=self.endpoint,
            aws_access_key_id=os.environ.get("SNAKEMAKE_STORAGE_S3_ACCESS_KEY"),
            aws_secret_access_key=os.environ.get("SNAKEMAKE_STORAGE_S3_SECRET_KEY"))

    def refusal(self, error: Exception) -> UserError | None:
        """A failed request as the workflow says its own (no credentials, keys refused, an endpoint
        out of reach: `shardinfer.input.bucket.storage_refusal`), in one line; None for another error."""
        return storage_refusal(error, self.where, self.endpoint, VERIFY_REACH)

    def sizes(self) -> dict[str, int]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        found = {}
        for item in (item for page in pages for item in page.get("Contents", [])):
            name = item["Key"][len(self.prefix):]
            top, below, _ = name.partition("/")
            found[top + below] = 0 if below else item["Size"]
        return found

    def read(self, name: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None

    def open(self, name: str) -> BinaryIO:
        size = self.client.head_object(Bucket=self.bucket, Key=self.prefix + name)["ContentLength"]
        return io.BufferedReader(RangedObject(self.client, self.bucket, self.prefix + name, size), CHUNK_BYTES)


class RangedObject(io.RawIOBase):
    """An object in a bucket read as a seekable file, a range at a time: a Parquet footer costs a
    request or two, not the object."""

    def __init__(self, client, bucket: str, key: str, size: int):
        self.client, self.bucket, self.key, self.size, self.position = client, bucket, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.position = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence] + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer) -> int:
        end = min(self.position + len(buffer), self.size)
        if end <= self.position:
            return 0
        data = self.client.get_object(Bucket=self.bucket, Key=self.key,
                                      Range=f"bytes={self.position}-{end - 1}")["Body"].read()
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)


def folder_at(location: str, endpoint_url: str | None = None) -> LocalFolder | BucketFolder:
    return BucketFolder(location, endpoint_url) if location.startswith("s3://") else LocalFolder(location)


def read_manifest(folder) -> dict:
    raw = folder.read(MANIFEST_NAME)
    if raw is None:
        raise ProofError(f"`{folder.where}` has no {MANIFEST_NAME}: not a proven folder of parts (or not yet: gather "
                         "writes it last)")
    try:
        content = json.loads(raw)
    except ValueError as error:
        raise ProofError(f"`{folder.where}`: {MANIFEST_NAME} is not JSON ({error})") from None
    if not isinstance(content, dict) or content.get("format") != MANIFEST_FORMAT:
        raise ProofError(f"`{folder.where}`: {MANIFEST_NAME} is not a manifest of parts ({MANIFEST_FORMAT})")
    return content


def check_names(folder, manifest: dict, sizes: dict[str, int]) -> None:
    """Every part there by its name and size, nothing else a reader would take (`.` names are passed
    over by readers: Snakemake's own marker, the manifest)."""
    listed = {part["name"]: part for part in manifest["parts"]}
    missing = [name for name in listed if name not in sizes]
    extra = [name for name in sorted(sizes) if name not in listed and not name.startswith(".")]
    for name in missing:
        renamed = [other for other in extra if sizes[other] == listed[name]["bytes"]]
        if renamed:
            raise ProofError(f"`{folder.where}`: part `{name}` was renamed to `{renamed[0]}` (rows "
                             f"[{listed[name]['start']}, {listed[name]['end']}))")
    if missing:
        part = listed[missing[0]]
        raise ProofError(f"`{folder.where}`: part `{missing[0]}` is missing (rows [{part['start']}, {part['end']}); "
                         f"{len(missing)} missing)")
    if extra:
        raise ProofError(f"`{folder.where}`: `{extra[0]}` is not a part its manifest names (an extra file, which "
                         "readers would take for data); remove it")
    for name, part in listed.items():
        if sizes[name] != part["bytes"]:
            with folder.open(name) as handle:
                check_place(folder, name, footer_rows(handle), manifest)
            how = "truncated" if sizes[name] < part["bytes"] else "edited or replaced"
            raise ProofError(f"`{folder.where}`: part `{name}` has {sizes[name]} bytes, its manifest {part['bytes']}: "
                             f"{how}")


def check_ranges(folder, manifest: dict) -> None:
    """The parts run through the rows in order: each starts where the one before ended."""
    row = 0
    for part in manifest["parts"]:
        if (part["start"], part["end"] - part["start"]) != (row, part["rows"]):
            raise ProofError(f"`{folder.where}`: its manifest's part `{part['name']}` holds rows [{part['start']}, "
                             f"{part['end']}), not {part['rows']} rows from row {row}")
        row = part["end"]
    if row != manifest["rows"]:
        raise ProofError(f"`{folder.where}`: its manifest's parts hold {row} rows, the manifest says "
                         f"{manifest['rows']}")


def check_part_files(folder, manifest: dict) -> None:
    """Each part's footer names the manifest's plan and settings and holds its rows; then its bytes
    are read for their SHA-256."""
    for part in manifest["parts"]:
        where = f"`{folder.where}`: part `{part['name']}`"
        with folder.open(part["name"]) as handle:
            try:
                meta = pq.ParquetFile(handle).metadata
            except Exception as error:  # pyarrow raises several kinds for a file that is not Parquet
                if type(error).__module__.startswith("botocore"):
                    raise  # the bucket's, not the file's: said by `verify_folder`
                raise ProofError(f"{where} is not a readable Parquet file ({str(error).splitlines()[0]})") from None
            identity = json.loads((meta.metadata or {}).get(IDENTITY_KEY, b"{}"))
            if (identity.get("plan_id"), identity.get("digest")) != (manifest["plan_id"], manifest["digest"]):
                raise ProofError(f"{where} was made under plan {identity.get('plan_id')} (settings "
                                 f"{identity.get('digest')}), its manifest names plan {manifest['plan_id']} (settings "
                                 f"{manifest['digest']}): the manifest is stale")
            check_place(folder, part["name"], placed_rows(meta), manifest)
            if meta.num_rows != part["rows"]:
                raise ProofError(f"{where} holds {meta.num_rows} rows, its manifest {part['rows']}")
            handle.seek(0)
            if sha256_of(handle) != part["sha256"]:
                raise ProofError(f"{where} is not the file its manifest names (SHA-256 differs): edited")


def placed_rows(meta: pq.FileMetaData) -> tuple[int, int] | None:
    """The rows [first, end) a part's footer says it holds (its piece's place, its row count); None
    for a footer without a place."""
    place = json.loads((meta.metadata or {}).get(PIECE_KEY, b"null"))
    return (place["first"], place["first"] + meta.num_rows) if isinstance(place, dict) else None


def footer_rows(handle: BinaryIO) -> tuple[int, int] | None:
    """`placed_rows` of a file that may not be Parquet at all (None then)."""
    try:
        return placed_rows(pq.ParquetFile(handle).metadata)
    except Exception as error:  # a cut or foreign file: its size is what is said of it
        if type(error).__module__.startswith("botocore"):
            raise
        return None


def check_place(folder, name: str, found: tuple[int, int] | None, manifest: dict) -> None:
    """A part that holds other rows than the manifest's for its name is said to, with the part whose
    rows they are (two parts swapped, one copied over another), not called truncated or edited."""
    part = next(part for part in manifest["parts"] if part["name"] == name)
    if found is None or found == (part["start"], part["end"]):
        return
    owner = next((other["name"] for other in manifest["parts"] if (other["start"], other["end"]) == found), None)
    whose = f", the rows of part `{owner}`: parts swapped or copied over one another" if owner else ""
    raise ProofError(f"`{folder.where}`: part `{name}` holds rows [{found[0]}, {found[1]}) where rows "
                     f"[{part['start']}, {part['end']}) were expected{whose}")


def sha256_of(handle: BinaryIO) -> str:
    digest = hashlib.new(DIGEST_ALGORITHM)
    while chunk := handle.read(CHUNK_BYTES):
        digest.update(chunk)
    return f"{DIGEST_ALGORITHM}:{digest.hexdigest()}"


def verify_folder(location: str, quick: bool = False, plan_id: str | None = None,
                  endpoint_url: str | None = None) -> dict:
    """The folder's manifest, once the folder holds exactly the parts it names, each of its size (and
    unless `quick`, of the plan and settings it names, and its bytes); `plan_id`: the plan the folder
    must be of. Raises ProofError naming the first fault."""
    folder = folder_at(location, endpoint_url)
    try:
        return verified(folder, quick, plan_id)
    except UserError:
        raise
    except Exception as error:  # a bucket's request refused or out of reach: one line, not boto3's traceback
        refusal = folder.refusal(error) if isinstance(folder, BucketFolder) else None
        if refusal is None:
            raise
        raise refusal from None


def verified(folder: LocalFolder | BucketFolder, quick: bool, plan_id: str | None) -> dict:
    """`verify_folder`'s checks of a folder reached."""
    manifest = read_manifest(folder)
    if plan_id is not None and manifest["plan_id"] != plan_id:
        raise ProofError(f"`{folder.where}` is the table of plan {manifest['plan_id']}, the current plan is {plan_id}: "
                         "stale; rerun the workflow")
    check_ranges(folder, manifest)
    check_names(folder, manifest, folder.sizes())
    if not quick:
        check_part_files(folder, manifest)
    return manifest


def damage(location: str) -> str | None:
    """What is wrong with a folder that has a manifest, by names and sizes (None: nothing seen, or no
    manifest at all): the Snakefile's check of a folder before a run (a part deleted reruns gather)."""
    if LocalFolder(location).read(MANIFEST_NAME) is None:
        return None  # no proof to withdraw: gather runs anyway, its output missing
    try:
        verify_folder(location, quick=True)
    except ProofError as error:
        return str(error)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="the folder of parts: a path, or s3://bucket/prefix/")
    parser.add_argument("--quick", action="store_true", help="names and sizes only, no byte read")
    parser.add_argument("--plan", help="the run's plan.json: the folder must be of this plan")
    parser.add_argument("--endpoint-url", help="an S3-compatible server's endpoint (default: "
                        "$SNAKEMAKE_STORAGE_S3_ENDPOINT_URL, else AWS)")
    args = parser.parse_args(argv)
    plan_id = json.loads(Path(args.plan).read_text())["plan_id"] if args.plan else None
    try:
        manifest = verify_folder(args.folder, args.quick, plan_id, args.endpoint_url)
    except UserError as error:  # a fault of the folder's, or a bucket that refused or was out of reach
        print(f"ERROR {error}", file=sys.stderr)
        return 1
    checked = "names and sizes" if args.quick else "names, sizes, footers and SHA-256"
    print(f"verified {args.folder}: {len(manifest['parts'])} parts, {manifest['rows']:,} rows, {manifest['bytes']:,} "
          f"bytes ({checked}); plan {manifest['plan_id']}, settings {manifest['digest']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
