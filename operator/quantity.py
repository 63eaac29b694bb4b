"""Kubernetes resource quantities compared by value, as the API server compares them.

The API server canonicalises quantities it stores (`10240Mi` comes back as `10Gi`, `1000m` as
`1`), so comparing the strings the operator wrote with the ones it reads back would see changes
that are not there: a WAL claim reported as changed forever, a pod template patched on every
pass. Every place the operator compares quantities goes through `same_quantity`.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

# Keys whose values (in Pod, PVC and StatefulSet specs) are maps of resource name -> quantity.
QUANTITY_MAPS = frozenset({"requests", "limits", "capacity", "allocatable"})


def quantity_value(value: Any) -> Decimal:
    """The value of a quantity (`'10Gi'`, `'500m'`, `3`); ValueError when it is not one."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    return parse_quantity(value)


def wal_capacity_bytes(size: Any) -> int:
    """Ring size for a WAL volume of `size`: 90 % of it, whole MiB, leaving the filesystem room."""
    total = int(quantity_value(size))
    return max(1 << 20, (total * 9 // 10) >> 20 << 20)


def same_quantity(a: Any, b: Any) -> bool:
    """True when both are quantities of the same value (`10240Mi` == `10Gi`); plain equality
    for anything that does not parse (a wrong value must still read as a difference)."""
    if a == b:
        return True
    try:
        return quantity_value(a) == quantity_value(b)
    except (ValueError, TypeError, ArithmeticError):
        return False
