"""Without a shared filesystem: the object names a bucket holds under each input path, from which
`shardinfer.input.discovery.listed_input_parts` picks the parts, as it picks a folder's on disk.

Snakemake's storage interface lists objects only for `glob_wildcards` (`list_candidate_matches`),
which the S3 plugin (0.3.6) refuses for every `s3://` query ("bucket name contains a wildcard").
So the listing goes through the plugin's own S3 resource, with the endpoint and credentials the
run gives it; other providers get one file per input. It is the run's first request to the bucket:
a wrong key, a missing bucket, no credentials or an endpoint out of reach is refused here in one
line naming what to check (`storage_refusal`), not a traceback from deep in boto3. scripts/verify.py
says its own failed requests to a bucket with the same lines (`shardinfer.proof.verify`).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardinfer.core.errors import UserError, first_line
from shardinfer.input.discovery import is_glob, listing_root

# What S3 answers for keys it does not take (an unknown key, a wrong secret, a key without rights).
REFUSED_KEYS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken",
                "AuthorizationHeaderMalformed")
KEYS = "SNAKEMAKE_STORAGE_S3_ACCESS_KEY and SNAKEMAKE_STORAGE_S3_SECRET_KEY (profiles/s3)"


def object_names(top, folder: str) -> list[str]:
    """The names, relative to the storage prefix (`top`: its S3 storage object), of the objects below
    `folder`."""
    base = "" if top.key in (".", "") else f"{top.key}/"
    under = f"{base}{folder}/" if folder else base
    return sorted(item.key[len(base):] for item in top.s3bucket().objects.filter(Prefix=under)
                  if not item.key.endswith("/"))


def bucket_listing(provider, prefix: str, paths: list[str]) -> dict[str, list[str]]:
    """For each input path, the object names under its `listing_root` (one listing request per 1,000
    objects), `prefix` being the storage prefix without its trailing `/`. A provider that cannot list
    (not S3) gets an empty listing: each path is one object, and a glob or a folder (a trailing `/`)
    is refused in one line."""
    top = provider.object(prefix)
    if not hasattr(top, "s3bucket"):
        for path in paths:
            if is_glob(path) or path.endswith("/"):
                name = type(provider).__module__.removeprefix("snakemake_storage_plugin_")
                raise UserError(f"input path `{path}` is a glob or folder: listing one in the bucket needs the s3 "
                                f"storage provider (this run's is {name}); give one object")
        return {path: [] for path in paths}
    try:
        return {path: object_names(top, listing_root(path)) for path in paths}
    except Exception as error:  # boto3's, told apart in storage_refusal; anything else is no user's error
        refusal = storage_refusal(error, prefix, getattr(getattr(provider, "settings", None), "endpoint_url", None))
        if refusal is None:
            raise
        raise refusal from None


@dataclass(frozen=True)
class Reach:
    """How a program reaches the bucket, for the fixes its refusals name: the workflow's (Snakemake's
    options; the default) or scripts/verify.py's. The keys are read from the same variables by both."""

    verb: str = "list"  # what the program was doing: "list", "read"
    endpoint_option: str = "--storage-s3-endpoint-url"
    bucket_fix: str = "create it, or give --default-storage-prefix an existing bucket"


WORKFLOW = Reach()


def storage_refusal(error: Exception, prefix: str, endpoint: str | None, reach: Reach = WORKFLOW) -> UserError | None:
    """The one line for a failed request for `prefix` (s3://bucket/...) that the user can fix, naming
    what to check (`reach`: the program's own options); None for another error (not boto3's, or a
    fault of the server's own)."""
    from botocore import exceptions as boto  # with the S3 plugin, which lists through boto3

    where, doing = f"the S3 storage at {endpoint or 'its default endpoint'}", f"{reach.verb}ing"
    if isinstance(error, boto.ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        said = f"{code}: {error.response.get('Error', {}).get('Message') or first_line(error)}"
        if code == "NoSuchBucket":
            return UserError(f"the bucket of `{prefix}` does not exist in {where} ({said}); {reach.bucket_fix}")
        if code in REFUSED_KEYS:
            return UserError(f"{where} refused the credentials {doing} `{prefix}` ({said}); check {KEYS}")
        return UserError(f"{where} refused to {reach.verb} `{prefix}` ({said})") if code else None
    if isinstance(error, boto.NoCredentialsError):
        return UserError(f"no credentials to {reach.verb} `{prefix}` in {where}: set {KEYS}")
    if isinstance(error, (boto.ConnectionError, boto.HTTPClientError)):
        return UserError(f"{where} is out of reach {doing} `{prefix}` ({first_line(error)}); check "
                         f"{reach.endpoint_option} and that the server runs")
    if isinstance(error, boto.BotoCoreError):
        return UserError(f"{doing} `{prefix}` in {where} failed ({first_line(error)})")
    return None
