"""Object storage: one interface (`ObjectStore`), backends chosen by URL.

s3://bucket?endpoint=http://127.0.0.1:8333&region=us-east-1&path_style=true
file:///var/lib/automq/objects          (embedded default)
"""

from automq.broker.objectstore.base import (
    AccessDenied,
    BucketNotFound,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    PreconditionFailed,
    PutResult,
    WritePace,
)


def open_object_store(url: str) -> ObjectStore:
    """Create the backend a URL names. Raises ValueError naming what is wrong with the URL."""
    from urllib.parse import urlsplit

    scheme = urlsplit(url).scheme
    if scheme == "file":
        from automq.broker.objectstore.local import LocalObjectStore

        return LocalObjectStore.from_url(url)
    if scheme == "s3":
        from automq.broker.objectstore.s3 import S3ObjectStore

        return S3ObjectStore.from_url(url)
    raise ValueError(f"object store URL {url!r}: scheme must be s3:// or file://")


__all__ = [
    "AccessDenied",
    "BucketNotFound",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreUnavailable",
    "PreconditionFailed",
    "PutResult",
    "WritePace",
    "open_object_store",
]
