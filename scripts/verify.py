"""Check a folder of parts (output.layout: parts) against its manifest, on disk or in a bucket:
see shardinfer.proof.verify (`python scripts/verify.py --help`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from shardinfer.proof.verify import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
