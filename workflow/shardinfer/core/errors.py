"""Errors a user can fix: reported as one line, never as a traceback."""

import re


class UserError(Exception):
    """Bad config, bad input or a failed proof: the message names the value and what is allowed."""


class RowError(UserError):
    """Predicting some rows failed in the task's own code or model (a user's hook raised): fatal by
    default, narrowed down to the failing rows and recorded with `row_errors.mode: record`."""


class ProofError(UserError):
    """Gather found shard files that do not add up to the input, row for row."""


def first_line(error: BaseException) -> str:
    """The telling line of a library error, for a one-line UserError: torch's state-dict errors put
    it after a heading ending in ":"; pydantic's ("1 validation error for VllmConfig") on the line
    after that, before its "[type=...]" tail and "For further information" link."""
    lines = [line.strip() for line in str(error).splitlines()
             if line.strip() and not line.strip().startswith("For further information")]
    if not lines:
        return type(error).__name__
    if re.match(r"\d+ validation errors? for", lines[0]) and len(lines) > 1:
        return " ".join(lines[1:3]).split(" [type=")[0]
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def words_list(words) -> str:
    """`a`, `a and b`, `a, b and c`: names in a message."""
    words = list(words)
    return " and ".join([", ".join(words[:-1]), words[-1]]) if len(words) > 1 else "".join(words)
