"""Without a shared filesystem: the object names a bucket holds under each input path, from which
`shardinfer.input.discovery.listed_input_parts` picks the parts, as it picks a folder's on disk.

Snakemake's storage interface lists objects only for `glob_wildcards` (`list_candidate_matches`),
which the S3 plugin (0.3.6) refuses for every `s3://` query ("bucket name contains a wildcard").
So the listing goes through the plugin's own S3 resource, with the endpoint and credentials the
run gives it; other providers get one file per input.
"""

from __future__ import annotations

from shardinfer.errors import UserError
from shardinfer.input.discovery import is_glob, listing_root


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
    return {path: object_names(top, listing_root(path)) for path in paths}
