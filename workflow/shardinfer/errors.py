"""Errors a user can fix: reported as one line, never as a traceback."""


class UserError(Exception):
    """Bad config, bad input or a failed proof: the message names the value and what is allowed."""


class ProofError(UserError):
    """Gather found shard files that do not add up to the input, row for row."""
