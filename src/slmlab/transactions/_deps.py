"""The optional dependencies of :mod:`slmlab.transactions` (the ``transactions`` extra), imported once
with an error that names the extra."""

from __future__ import annotations

try:
    import pandas as pd
    import pyarrow  # noqa: F401  (Parquet export/import)
    import sklearn  # noqa: F401  (metrics and the gradient-boosting baseline)
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"slmlab.transactions needs the `transactions` extra ({err.name} is missing);"
        " install it with: pip install 'slmlab[transactions]'"
    ) from err

__all__ = ["pd"]
