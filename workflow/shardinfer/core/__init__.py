"""The ground every room stands on: errors a user can fix (one line, never a traceback), files that
appear whole or not at all, and a rule's function run inside its Snakemake job. Imports nothing of
the package."""
