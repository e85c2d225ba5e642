"""Sharded batch inference that proves every input row comes back once, in order.

Planning (`plan`) and gathering (`proof`, writing through `output`) never import torch, so they run anywhere in seconds;
inference (`shard`) runs one contiguous shard on one device.

The package is a house of rooms, one folder each, every import running downwards: a module imports
its own room and the rooms below it, never one above (tests/test_layout.py holds it, and
docs/development/architecture.md lists each room's modules from their docstrings). Each room's
`__init__` says what it holds.
"""

# The rooms, bottom to top.
ROOMS = (
    "core",
    "settings",
    "contract",
    "input",
    "plan",
    "hf",
    "nodes",
    "tasks",
    "engines",
    "shard",
    "scores",
    "output",
    "proof",
    "snakefile",
    "report",
)
