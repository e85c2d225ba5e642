"""What the input is and how it is read: which files make up `input.path` (on disk or in a bucket),
one module per format behind one interface (`formats/base.py`), the plan's scan, parts numbered
across files, staging and each shard's cut. Imports the rooms below it; never torch."""
