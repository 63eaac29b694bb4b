"""The operator's certificate authority: pure functions over PEM bytes (no Kubernetes here).

Two CAs per cluster, as Strimzi keeps them: the *cluster CA* signs the brokers' (and
controllers') certificates and is what clients trust; the *clients CA* signs users' client
certificates (AutoMQUser authentication tls) and is what brokers verify clients against.
Keys are ECDSA P-256. Everything takes `now`, so renewal is tested without waiting a year.

Renewal: a leaf certificate is re-issued when it is missing, no longer matches the names it
must carry, was signed by a CA no longer trusted, or has fewer than `renewal_days` left. The
caller replaces a CA earlier than its leaves (see `automq.operator.security`); the old CA stays
in the trust bundle until it expires, so certificates signed by it keep working while clients
pick up the new CA (brokers re-read their files, see broker/security/tls.py).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12 as pkcs12_format
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CLIENT_ORGANIZATION = (
    "automq-user"  # O= of users' client certificates (the broker maps CN=<user>,O=this to User:<user>)
)
BROKER_ORGANIZATION = "automq-cluster"
# Kafka's ssl.principal.mapping.rules: a user certificate's principal is User:<CN>, the name the
# AutoMQUser's ACLs use; any other certificate keeps its full DN (Kafka's DEFAULT).
PRINCIPAL_MAPPING_RULES = [f"RULE:^CN=([^,]+),O={CLIENT_ORGANIZATION}$/$1/", "DEFAULT"]


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def new_ca(common_name: str, now: dt.datetime, validity_days: int) -> KeyPair:
    key = _key()
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, BROKER_ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=validity_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(_cert_pem(cert), _key_pem(key))


def issue(
    ca: KeyPair,
    subject: x509.Name,
    now: dt.datetime,
    validity_days: int,
    *,
    dns_names: Sequence[str] = (),
    server: bool,
) -> KeyPair:
    """A leaf certificate signed by `ca`. Node certificates (server=True) carry serverAuth and
    clientAuth (a broker also calls other nodes); user certificates only clientAuth."""
    ca_cert = ca.cert
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    not_after = min(now + dt.timedelta(days=validity_days), ca_cert.not_valid_after_utc)
    usages = (
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        if server
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )  # digitalSignature (ECDHE key exchange)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if dns_names:
        names: list[x509.GeneralName] = []
        for name in dns_names:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                names.append(x509.DNSName(name))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(_cert_pem(cert) + ca.cert_pem, _key_pem(key))  # chain: leaf, then its CA


def node_subject(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, BROKER_ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def user_subject(user: str) -> x509.Name:
    """CN=<user>,O=automq-user (RFC 2253 order): PRINCIPAL_MAPPING_RULES map it to User:<user>."""
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, CLIENT_ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, user),
        ]
    )


def pkcs12(name: str, pair: KeyPair, password: str) -> bytes:
    """The key and certificate chain as a PKCS#12 keystore (what Java clients load)."""
    key = serialization.load_pem_private_key(pair.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    chain = load_chain(pair.cert_pem)
    return pkcs12_format.serialize_key_and_certificates(
        name.encode(),
        key,
        chain[0],
        chain[1:] or None,
        serialization.BestAvailableEncryption(password.encode()),
    )


def load_chain(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def bundle(*pems: bytes, now: dt.datetime) -> bytes:
    """Distinct, unexpired certificates of the PEM inputs, in order, as one PEM bundle."""
    seen: set[bytes] = set()
    out = b""
    for pem in pems:
        for cert in load_chain(pem):
            der = cert.public_bytes(serialization.Encoding.DER)
            if der in seen or cert.not_valid_after_utc <= now:
                continue
            seen.add(der)
            out += _cert_pem(cert)
    return out


def days_left(cert: x509.Certificate, now: dt.datetime) -> float:
    return (cert.not_valid_after_utc - now).total_seconds() / 86400


def ca_due(ca: KeyPair | None, now: dt.datetime, renewal_days: int) -> str | None:
    """Why the CA must be (re)created, or None."""
    if ca is None:
        return "no CA yet"
    try:
        cert = ca.cert
        serialization.load_pem_private_key(ca.key_pem, password=None)
    except ValueError as exc:
        return f"the stored CA cannot be read ({exc})"
    left = days_left(cert, now)
    if left < renewal_days:
        return f"the CA expires in {left:.1f} days (renewal {renewal_days} days before)"
    return None


def leaf_due(
    leaf: KeyPair | None,
    ca: KeyPair,
    now: dt.datetime,
    renewal_days: int,
    dns_names: list[str] | None = None,
    previous_cas: Sequence[x509.Certificate] = (),
) -> str | None:
    """Why a leaf certificate must be (re)issued, or None. A leaf signed by one of
    `previous_cas` is still fine (the caller passes them while a new CA is being distributed)."""
    if leaf is None:
        return "no certificate yet"
    chain = load_chain(leaf.cert_pem)
    if not chain:
        return "the stored certificate cannot be read"
    cert = chain[0]
    try:
        key = serialization.load_pem_private_key(leaf.key_pem, password=None)
    except ValueError:
        return "the stored key cannot be read"
    if key.public_key().public_numbers() != cert.public_key().public_numbers():  # type: ignore[union-attr]
        return "the stored key does not belong to the certificate"
    if not any(_signed_by(cert, issuer) for issuer in (ca.cert, *previous_cas)):
        return "it was signed by another CA"
    left = days_left(cert, now)
    if left < renewal_days:
        return f"it expires in {left:.1f} days (renewal {renewal_days} days before)"
    if dns_names is not None and sorted(subject_alt_names(cert)) != sorted(dns_names):
        return "its names changed"
    return None


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    if cert.issuer != ca.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def subject_alt_names(cert: x509.Certificate) -> list[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*ext.get_values_for_type(x509.DNSName), *(str(ip) for ip in ext.get_values_for_type(x509.IPAddress))]
