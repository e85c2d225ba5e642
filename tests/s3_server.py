"""A real S3-compatible server on localhost for the tests without a shared filesystem, and the ways
the tests use it: SeaweedFS (`weed mini`) started by tests/storage/start-s3 with its own made-up
keys, reached through boto3 as any S3 client would, and handed to Snakemake's S3 storage plugin
through the environment variables a user sets (profiles/s3)."""

from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

import patience
import plugins  # the S3 storage plugin and boto3 lie in plugins.PLUGINS, beside the venv

SCRIPTS = Path(__file__).resolve().parent / "storage"


@dataclass(frozen=True)
class S3Server:
    folder: Path
    endpoint: str
    bucket: str
    access_key: str
    secret_key: str

    def client(self):
        plugins.importable()  # boto3 lies beside the venv, with the S3 storage plugin
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1")

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=self.bucket, Key=key, Body=data)

    def get(self, key: str) -> bytes:
        return self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def exists(self, key: str) -> bool:
        return bool(self.client().list_objects_v2(Bucket=self.bucket, Prefix=key).get("KeyCount"))

    def modified(self, key: str):
        """The object's LastModified, None when there is none."""
        try:
            return self.client().head_object(Bucket=self.bucket, Key=key)["LastModified"]
        except self.client().exceptions.ClientError:
            return None

    def keys(self, prefix: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def read_parquet(self, key: str) -> pd.DataFrame:
        return pd.read_parquet(io.BytesIO(self.get(key)))

    def env(self) -> dict[str, str]:
        """The credentials as a user gives them to Snakemake (profiles/s3): in the environment."""
        return {"SNAKEMAKE_STORAGE_S3_ACCESS_KEY": self.access_key, "SNAKEMAKE_STORAGE_S3_SECRET_KEY": self.secret_key}

    def storage_args(self, prefix: str) -> list[str]:
        """The command-line settings a run in `prefix` of the bucket adds to profiles/s3's."""
        return ["--default-storage-prefix", self.url(prefix), "--storage-s3-endpoint-url", self.endpoint]


def free_port() -> int:
    """A port nothing listens on (taken from the kernel, then let go): an endpoint out of reach."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


def start(folder: Path) -> S3Server:
    """Start the server (tests/storage/start-s3); raises RuntimeError saying why it did not come up,
    or why the plugins that reach it are missing."""
    if not (plugins.PLUGINS / "snakemake_storage_plugin_s3").is_dir():
        raise RuntimeError(f"no S3 storage plugin in {plugins.PLUGINS}: run tests/install-plugins")
    env = {**os.environ, "PYTHON": sys.executable}
    started = patience.run([str(SCRIPTS / "start-s3"), str(folder)], [folder], env=env)
    if started.returncode != 0:
        raise RuntimeError(f"tests/storage/start-s3 failed: {started.stderr.strip()[-2000:]}")
    values = dict(line.split("=", 1) for line in started.stdout.split())
    return S3Server(folder, values["S3_ENDPOINT"], values["S3_BUCKET"], values["S3_ACCESS_KEY"],
                    values["S3_SECRET_KEY"])


def stop(server: S3Server) -> None:
    patience.run([str(SCRIPTS / "stop-s3"), str(server.folder)])
