"""Pieces every part of the codec shares: the buffer type, the signature-keeping cache, the
constants of the framing, and the length error of the pre-check."""

from __future__ import annotations

import datetime
import functools
import struct
from collections.abc import Callable
from typing import Any, TypeVar, cast

ZERO_THROTTLE = datetime.timedelta(0)
# what the frame walkers read: a received frame, or a view of it
Buffer = bytes | bytearray | memoryview
_F = TypeVar("_F", bound=Callable[..., Any])


def _memo(fn: _F) -> _F:
    """functools.cache that keeps the function's signature for the type checker (kio's
    message classes are hashable, but typed as type[Any], which typeshed's cache refuses)."""
    return cast(_F, functools.cache(fn))


class _CloseConnection:
    """Returned by a handler instead of a response: send nothing and close the connection
    once earlier responses are out (Kafka does this for a failed acks=0 produce)."""

    def __repr__(self) -> str:
        return "CLOSE_CONNECTION"


CLOSE_CONNECTION = _CloseConnection()


API_VERSIONS_KEY = 18
PRODUCE_KEY = 0
_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class _LengthError(Exception):
    pass
