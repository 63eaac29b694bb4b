"""Object-store URLs: what each backend accepts, and ValueErrors that name the problem."""

import pytest

from automq.broker.objectstore import open_object_store
from automq.broker.objectstore.local import LocalObjectStore
from automq.broker.objectstore.s3 import S3ObjectStore, parse_s3_url


def test_s3_url_settings():
    settings = parse_s3_url(
        "s3://my-bucket?endpoint=http://127.0.0.1:8333/&region=eu-west-1&path_style=true"
        "&max_attempts=7&timeout_ms=1500&part_size=6291456"
    )
    assert (settings.bucket, settings.endpoint, settings.region, settings.path_style) == (
        "my-bucket",
        "http://127.0.0.1:8333",
        "eu-west-1",
        True,
    )
    assert (settings.max_attempts, settings.timeout_ms, settings.part_size) == (7, 1500, 6 << 20)
    defaults = parse_s3_url("s3://bucket")
    assert defaults.endpoint is None and defaults.region == "us-east-1" and not defaults.path_style
    assert isinstance(open_object_store("s3://bucket"), S3ObjectStore)


@pytest.mark.parametrize(
    "url, problem",
    [
        ("s3://?endpoint=http://x", "missing bucket"),
        ("s3:///path", "missing bucket"),
        ("s3://Bad_Bucket", "not a valid bucket name"),
        ("s3://ab", "not a valid bucket name"),
        ("s3://bucket/prefix", "prefix"),
        ("s3://bucket?colour=blue", "unknown parameter 'colour'"),
        ("s3://bucket?endpoint=ftp://x", "endpoint must be an http"),
        ("s3://bucket?endpoint=", "endpoint must be an http"),
        ("s3://bucket?path_style=yes", "path_style must be true or false"),
        ("s3://bucket?max_attempts=0", "max_attempts must be >= 1"),
        ("s3://bucket?timeout_ms=soon", "timeout_ms must be an integer"),
        ("s3://bucket?part_size=1024", "part_size must be >="),
        ("s3://bucket?read_part_size=1000", "read_part_size must be >= 65536"),
        ("s3://bucket?read_concurrency=0", "read_concurrency must be >= 1"),
        ("s3://bucket?region=", "region must not be empty"),
        ("s3://bucket?region=a&region=b", "given twice"),
        ("file://host/path", "host must be empty"),
        ("file://relative", "host must be empty"),
        ("file:///", "absolute directory path"),
        ("file:///data%00x", "NUL"),
        ("file:///data?fsync=maybe", "fsync must be true or false"),
        ("file:///data?colour=blue", "unknown query parameter 'colour'"),
        ("file:///data?max_concurrency=0", "max_concurrency must be >= 1"),
        ("http://bucket", "scheme must be s3:// or file://"),
        ("/var/lib/objects", "scheme must be s3:// or file://"),
    ],
)
def test_bad_urls_name_the_problem(url, problem):
    with pytest.raises(ValueError, match=problem.replace("?", r"\?")):
        open_object_store(url)


def test_file_url_options():
    store = open_object_store("file:///var/lib/automq/objects?fsync=false&max_concurrency=4")
    assert isinstance(store, LocalObjectStore)
    assert str(store.root) == "/var/lib/automq/objects"
    assert open_object_store("file://localhost/data").root.as_posix() == "/data"
    assert open_object_store("file:///srv/my%20objects").root.as_posix() == "/srv/my objects"
