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


def test_launcher_repicks_ports_taken_before_weed_binds(tmp_path, monkeypatch):
    """Parallel test sessions can grab a probed port before weed binds it."""
    import socket

    from automq.broker.objectstore import seaweedfs as launcher

    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    busy = blocker.getsockname()[1]
    real_pick = launcher._free_port_pair
    handed_out: list[int] = []

    def pick(taken):
        port = busy if not handed_out else real_pick(taken | {busy})
        handed_out.append(port)
        return port

    monkeypatch.setattr(launcher, "_free_port_pair", pick)
    server = launcher.SeaweedFS(data_dir=tmp_path / "weed")
    try:
        server.start()
        assert busy not in server.ports.values()
        assert len(handed_out) > len(launcher._COMPONENTS)  # a second round of ports was picked
        server.client().list_buckets()
    finally:
        server.remove()
        blocker.close()
