"""Build the bundled demo input, resources/demo/texts.jsonl, from text that ships with Python.

The sentences of the interpreter's own help topics (pydoc_data.topics): real English prose of
mixed length. Run once with `python scripts/make_demo_data.py`; the output is committed, so the
demo does not depend on the Python version that runs it.
"""

import json
import re
import sys
from pathlib import Path
from pydoc_data.topics import topics

ROWS = 3000
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def demo_rows(limit: int = ROWS) -> list[dict]:
    rows = []
    for topic in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[topic]):
            text = " ".join(paragraph.split())
            if text.startswith((">>>", "...")) or len(text) < 40:
                continue
            for sentence in SENTENCE_END.split(text):
                if len(sentence) >= 20 and len(rows) < limit:
                    rows.append({"id": len(rows), "topic": topic, "text": sentence})
    return rows


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "resources/demo/texts.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = demo_rows()
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} rows to {out}")
