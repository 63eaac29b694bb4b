"""Test certificates made with `cryptography` at test time (no private key is committed):
a CA, a server certificate for 127.0.0.1/localhost, client certificates, and an unrelated CA's
client certificate that must be refused."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(**parts: str) -> x509.Name:
    oids = {"CN": NameOID.COMMON_NAME, "O": NameOID.ORGANIZATION_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME}
    # give parts most general first (O=..., CN=...), as x509 stores them; RFC 2253 prints
    # them reversed: CN=alice,O=acme
    return x509.Name([x509.NameAttribute(oids[k], v) for k, v in parts.items()])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@dataclass
class Ca:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path

    @classmethod
    def create(cls, directory: Path, name: str) -> Ca:
        key = _key()
        subject = _name(CN=name)
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(key, hashes.SHA256())
        )
        path = directory / f"{name}.pem"
        _write_cert(cert, path)
        return cls(key, cert, path)

    def issue(
        self, directory: Path, stem: str, *, server: bool, valid_days: float = 1, **subject: str
    ) -> tuple[Path, Path, x509.Certificate]:
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(**subject))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(
                # a node certificate is also presented as a client (broker -> controller mTLS)
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                    if server
                    else [ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            import ipaddress

            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
        _write_cert(cert, cert_path)
        _write_key(key, key_path)
        return cert_path, key_path, cert


@dataclass
class Pki:
    directory: Path
    ca: Ca
    server_cert: Path
    server_key: Path
    client_cert: Path  # CN=alice,O=acme
    client_key: Path
    rogue_cert: Path  # CN=mallory from a CA the broker does not trust
    rogue_key: Path

    @classmethod
    def create(cls, directory: Path) -> Pki:
        directory.mkdir(parents=True, exist_ok=True)
        ca = Ca.create(directory, "test-ca")
        server_cert, server_key, _ = ca.issue(directory, "server", server=True, O="acme", CN="localhost")
        client_cert, client_key, _ = ca.issue(directory, "alice", server=False, O="acme", CN="alice")
        rogue = Ca.create(directory, "rogue-ca")
        rogue_cert, rogue_key, _ = rogue.issue(directory, "mallory", server=False, O="evil", CN="mallory")
        return cls(directory, ca, server_cert, server_key, client_cert, client_key, rogue_cert, rogue_key)
