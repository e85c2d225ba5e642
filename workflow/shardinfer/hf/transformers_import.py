"""Import transformers in a job without the scikit-learn import it makes and never uses here.

When scikit-learn is installed (it is wherever `evaluate:` runs), `import transformers` imports it
and SciPy with it, only for assisted generation's confidence threshold (in
`transformers.generation.candidate_generator`), which no task here uses. That is about 1.3 s of CPU
at the start of every shard and tokenize job, paid once per shard. The finder below hides
scikit-learn while that one module runs and nowhere else, so the user's own code (a custom task,
a model's remote code) still imports it as usual. Lazy: a job that never imports transformers
(a custom task without it) imports nothing more for it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

ASKS_FOR_SKLEARN = "transformers.generation.candidate_generator"


class _HideWhileRunning(importlib.abc.Loader):
    """The module's own loader, run with `sklearn` marked absent (`find_spec` then answers None)."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        if "sklearn" in sys.modules:  # already imported by someone else: nothing to save
            self.loader.exec_module(module)
            return
        sys.modules["sklearn"] = None  # type: ignore[assignment]
        try:
            self.loader.exec_module(module)
        finally:
            if sys.modules.get("sklearn", 0) is None:
                del sys.modules["sklearn"]


class _SklearnHider(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != ASKS_FOR_SKLEARN:
            return None
        sys.meta_path.remove(self)  # once: the spec below comes from the usual finders
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _HideWhileRunning(spec.loader)
        return spec


def hide_sklearn_from_transformers() -> None:
    """From now on in this process, transformers loads without importing scikit-learn."""
    if ASKS_FOR_SKLEARN not in sys.modules and not any(isinstance(f, _SklearnHider) for f in sys.meta_path):
        sys.meta_path.insert(0, _SklearnHider())
