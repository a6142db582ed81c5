"""Host arrays, checked: whether an array holds only finite numbers.

No checkpoint of bad weights is ever written or loaded: `is_finite` is the
one check, over any size, with a bounded temporary.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_finite"]

_FINITE_CHUNK = 1 << 22  # elements checked at a time: a bounded temporary, whatever the array's size


def is_finite(value: Any) -> bool:
    """False if `value` is a floating-point array holding a NaN or an infinity."""
    import numpy as np

    if not isinstance(value, np.ndarray) or value.dtype.kind not in "fc":
        return True
    flat = value.reshape(-1)
    return all(np.isfinite(flat[start:start + _FINITE_CHUNK]).all() for start in range(0, flat.size, _FINITE_CHUNK))
