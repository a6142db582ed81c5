"""Numbers as JSON can carry them: NaN and infinities become ``null``.

Records, sidecars and REST answers are JSON, which has no ``NaN`` or
``Infinity``. `json_safe` makes any data JSON-ready that way; `finite_metrics`
makes a flat dict of logs into metrics (numbers, or None for a non-finite
one; what is not a number is left out). Pure.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping

__all__ = ["json_safe", "finite_metrics"]


def json_safe(value: Any) -> Any:
    """Returns `value` with every non-finite float (NaN, +-inf) made None.

    Goes into dicts, lists and tuples (tuples become lists). Floats of other
    types (numpy's, say) become plain floats. Everything else is returned
    as it is.

    Args:
        value: Data on its way to `json.dumps`.

    Returns:
        Data that `json.dumps(..., allow_nan=False)` accepts wherever
        `value`'s only problem was a non-finite float.

    Example:

    >>> json_safe({"loss": float("nan"), "acc": [1.0, float("inf")]})
    {'loss': None, 'acc': [1.0, None]}
    """
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        number = float(value)
        return number if math.isfinite(number) else None
    return value


def finite_metrics(values: Mapping[str, Any]) -> dict[str, float | None]:
    """Logs as metrics: each value that `float` takes, as a float (None for
    NaN and infinities); anything else (an array, a string, a device array
    whose computation failed: reading it raises) is left out.

    Example:

    >>> finite_metrics({"loss": float("nan"), "acc": 0.5, "name": "x"})
    {'loss': None, 'acc': 0.5}
    """
    plain: dict[str, float | None] = {}
    for key, value in values.items():
        try:
            number = float(value)
        except Exception:  # not a number, or one that cannot be read (a failed collective's)
            continue
        plain[str(key)] = number if math.isfinite(number) else None
    return plain
