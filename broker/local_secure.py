"""`automq local up --secure`: a local cluster with TLS + SCRAM, as production would run it.

Under `<data-dir>/secure/` (made once, reused by later starts): a private CA, a node
certificate for 127.0.0.1/localhost signed by it (keys 0600, never leave the machine), the
controller API token, the password of the SCRAM-SHA-512 user `admin`, and the brokers'
inter-broker credentials (the same user, in Kafka's JAAS syntax). Brokers listen
with SASL_SSL only (the first listener, on --port); the controller API is https with the
token. Once the cluster is ready the `admin` user is created through the controller, and the
client settings are printed.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from automq.broker.security import scram

ADMIN_USER = "admin"
SECURE_LISTENER = "SASL_SSL"
CERT_DAYS = 825


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _make_pki(directory: Path) -> None:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "automq local CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    node_key = ec.generate_private_key(ec.SECP256R1())
    node = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(node_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(directory / "ca.key", _key_pem(ca_key))
    _write_private(directory / "node.key", _key_pem(node_key))
    (directory / "node.crt").write_bytes(node.public_bytes(serialization.Encoding.PEM))
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))  # last: marks the set complete


@dataclass(frozen=True)
class SecureLocal:
    directory: Path

    @classmethod
    def ensure(cls, data_dir: Path) -> SecureLocal:
        directory = data_dir / "secure"
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        if not (directory / "ca.crt").exists():
            _make_pki(directory)
        for name, size in (("controller-token", 32), ("admin.password", 18)):
            if not (directory / name).exists():
                _write_private(directory / name, secrets.token_urlsafe(size).encode())
        local = cls(directory)
        # brokers reach each other (transaction markers) on the same SASL_SSL listener, as `admin`
        _write_private(
            local.inter_broker_jaas,
            f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN_USER}" '
            f'password="{local.admin_password}";\n'.encode(),
        )
        return local

    @property
    def inter_broker_jaas(self) -> Path:
        return self.directory / "inter-broker.jaas"

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def admin_password(self) -> str:
        return (self.directory / "admin.password").read_text().strip()

    def node_settings(self) -> dict[str, Any]:
        """The `tls` and `security` sections every node gets."""
        return {
            "tls": {
                "cert_file": str(self.directory / "node.crt"),
                "key_file": str(self.directory / "node.key"),
                "ca_file": str(self.ca_file),
            },
            "security": {
                "sasl_enabled_mechanisms": ["SCRAM-SHA-512", "SCRAM-SHA-256"],
                "controller_token_file": str(self.directory / "controller-token"),
                "controller_tls": True,
                "sasl_mechanism_inter_broker_protocol": "SCRAM-SHA-512",
                "sasl_inter_broker_jaas_config_file": str(self.inter_broker_jaas),
            },
        }

    def admin_upsertion(self) -> scram.ScramCredential:
        return scram.make_credential("SCRAM-SHA-512", self.admin_password)

    async def create_admin(self, controller_url: str) -> None:
        from automq.broker.config import TlsConfig
        from automq.broker.controller.client import ControllerClient
        from automq.broker.controller.protocol import ScramCredentialInfo
        from automq.broker.security.controller_auth import ControllerClientAuth, TokenFile
        from automq.broker.security.tls import client_context

        cred = self.admin_upsertion()

        def b64(b: bytes) -> str:
            return base64.b64encode(b).decode()

        info = ScramCredentialInfo(
            ADMIN_USER, cred.mechanism, b64(cred.salt), cred.iterations, b64(cred.stored_key), b64(cred.server_key)
        )
        auth = ControllerClientAuth(
            TokenFile(str(self.directory / "controller-token")), client_context(TlsConfig(ca_file=str(self.ca_file)))
        )
        async with ControllerClient([controller_url], auth=auth, retry_deadline_s=30) as client:
            await client.alter_scram_credentials([], [info])

    def client_settings(self, bootstrap: str) -> str:
        return "\n".join(
            [
                f"bootstrap.servers={bootstrap}",
                "security.protocol=SASL_SSL",
                "sasl.mechanism=SCRAM-SHA-512",
                f"sasl.username={ADMIN_USER}",
                f"sasl.password={self.admin_password}",
                f"ssl.ca.location={self.ca_file}",
                f"# controller API: export AUTOMQ_CONTROLLER_TOKEN_FILE={self.directory / 'controller-token'} "
                f"AUTOMQ_CONTROLLER_CA_FILE={self.ca_file}",
            ]
        )
