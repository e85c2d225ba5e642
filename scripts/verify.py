"""Check a folder of parts (output.layout: parts) against its manifest, on disk or in a bucket:
see shardinfer.proof.verify (`python scripts/verify.py --help`)."""

import sys

from shardinfer.proof.verify import main

if __name__ == "__main__":
    sys.exit(main())
