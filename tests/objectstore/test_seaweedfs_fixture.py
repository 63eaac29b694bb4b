"""The shared SeaweedFS fixture gives a working, credential-checked S3 endpoint and fresh buckets."""

import os
from urllib.parse import parse_qs, urlsplit

import botocore.exceptions
import pytest

pytestmark = pytest.mark.s3


def test_s3_url_names_a_fresh_writable_bucket_with_signed_requests(seaweedfs, s3_url):
    parts = urlsplit(s3_url)
    query = parse_qs(parts.query)
    assert parts.scheme == "s3" and query["endpoint"] == [seaweedfs.endpoint]
    assert os.environ["AWS_ACCESS_KEY_ID"] == seaweedfs.access_key
    client = seaweedfs.client()
    client.put_object(Bucket=parts.netloc, Key="probe", Body=b"hello")
    assert client.get_object(Bucket=parts.netloc, Key="probe")["Body"].read() == b"hello"
    assert [o["Key"] for o in client.list_objects_v2(Bucket=parts.netloc)["Contents"]] == ["probe"]

    seaweedfs.secret_key, real = "wrong-secret", seaweedfs.secret_key
    try:
        with pytest.raises(botocore.exceptions.ClientError) as denied:
            seaweedfs.client(max_attempts=1).get_object(Bucket=parts.netloc, Key="probe")
    finally:
        seaweedfs.secret_key = real
    assert denied.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_file_url_points_into_the_test_tmp_dir(file_url, tmp_path):
    assert file_url == f"file://{tmp_path}/objects"
