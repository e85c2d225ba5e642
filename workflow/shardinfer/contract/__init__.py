"""The shard file's contract between a shard job and gather: its index column, identity, stats and
column types, the digest of its values, its pieces and the files written per row. Imports `core` and
`settings`."""
