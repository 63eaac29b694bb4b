"""How this project's own Kafka client connections authenticate: TLS and SASL settings.

Two sources, one shape (`ClientSecurity`):
- a broker calling another broker (transaction markers) uses the inter-broker listener with
  the broker's own trust store and certificate (`tls` section, so mutual TLS works) and, on a
  SASL listener, `security.sasl_mechanism_inter_broker_protocol` with the user and password of
  `security.sasl_inter_broker_jaas_config_file` -- Kafka's `sasl.jaas.config` syntax, e.g.
  `org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="...";`
  (re-read at every new connection, so a rotated Secret needs no restart);
- the admin CLIs (`automq topics|groups|rebalance --command-config FILE`) read a client
  properties file with Kafka's client names (security.protocol, sasl.mechanism,
  sasl.jaas.config or librdkafka's sasl.username / sasl.password, ssl.ca.location,
  ssl.certificate.location, ssl.key.location, ssl.endpoint.identification.algorithm).

OAUTHBEARER and GSSAPI are not offered for these connections (no token endpoint client, no
Kerberos); PLAIN and SCRAM-SHA-256/512 are.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from automq.broker.config import ConfigError, Listener, NodeConfig, TlsConfig

CLIENT_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_JAAS_OPTION = re.compile(r'([A-Za-z_][\w.]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def parse_jaas(text: str, source: str) -> tuple[str, str]:
    """(username, password) from a Kafka JAAS line (`<LoginModule> required username="u" password="p";`)."""
    body = text.strip()
    if not re.match(r"^[\w.$]+\s+(required|requisite|sufficient|optional)\b", body):
        raise ConfigError(f'{source}: expected `<LoginModule class> required username="..." password="...";`')
    options = {k: re.sub(r"\\(.)", r"\1", v) for k, v in _JAAS_OPTION.findall(body)}
    if "username" not in options or "password" not in options:
        raise ConfigError(f'{source}: the JAAS entry needs both username="..." and password="..."')
    return options["username"], options["password"]


@dataclass(frozen=True)
class ClientSecurity:
    """What a client connection does before its first request. `ssl_context` is called per new
    connection (certificates rotated on disk are picked up); `credentials` likewise."""

    protocol: str = "PLAINTEXT"
    ssl_context: Callable[[], ssl.SSLContext] | None = None
    sasl_mechanism: str | None = None
    credentials: Callable[[], tuple[str, str]] | None = None
    token_auth: bool = False  # SCRAM with a delegation token (user = token id, password = its HMAC, base64)

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")


PLAINTEXT = ClientSecurity()


def _node_context(tls: TlsConfig, check_hostname: bool) -> Callable[[], ssl.SSLContext]:
    from automq.broker.security.tls import client_context

    def build() -> ssl.SSLContext:
        ctx = client_context(tls)
        if not check_hostname:
            ctx.check_hostname = False
        return ctx

    return build


def _jaas_file(path: str, source: str) -> Callable[[], tuple[str, str]]:
    def read() -> tuple[str, str]:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read {path}: {exc.strerror}") from exc
        return parse_jaas(text, f"{source} ({path})")

    return read


def inter_broker_listener(config: NodeConfig) -> Listener | None:
    """The listener other brokers are reached on: `kafka.inter_broker_listener_name`, else the
    first listener this broker can authenticate to (a SASL listener only with inter-broker
    credentials), else None (markers to other brokers cannot be delivered; logged at start)."""
    name = config.kafka.inter_broker_listener_name
    if name is not None:
        return next((lst for lst in config.listeners if lst.name == name), None)
    has_credentials = config.security.sasl_inter_broker_jaas_config_file is not None
    for lst in config.listeners:
        if not lst.security_protocol.startswith("SASL") or has_credentials:
            return lst
    return None


def inter_broker(config: NodeConfig) -> ClientSecurity:
    """The security of broker-to-broker connections on the inter-broker listener."""
    listener = inter_broker_listener(config)
    if listener is None or listener.security_protocol == "PLAINTEXT":
        return PLAINTEXT
    protocol = listener.security_protocol
    context = (
        _node_context(config.tls, config.tls.endpoint_identification_algorithm == "https")
        if protocol.endswith("SSL")
        else None
    )
    if not protocol.startswith("SASL"):
        return ClientSecurity(protocol, context)
    path = config.security.sasl_inter_broker_jaas_config_file
    assert path is not None  # config validation
    return ClientSecurity(
        protocol,
        context,
        inter_broker_mechanism(config),
        _jaas_file(path, "security.sasl_inter_broker_jaas_config_file"),
    )


def inter_broker_mechanism(config: NodeConfig) -> str:
    chosen = config.security.sasl_mechanism_inter_broker_protocol
    if chosen is not None:
        return chosen
    return next((m for m in config.security.sasl_enabled_mechanisms if m in CLIENT_SASL_MECHANISMS), "PLAIN")


# ---------------------------------------------------------------- client properties (CLIs)


def read_properties(path: str | Path) -> dict[str, str]:
    """A Java-style properties file: `key=value` (or `key: value`) lines, # and ! comments."""
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"--command-config: cannot read {path}: {exc.strerror}") from exc
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        m = re.match(r"^([^=:\s]+)\s*[=:]\s*(.*)$", line)
        if m is None:
            raise ConfigError(f"--command-config {path}:{number}: expected key=value, got {line[:40]!r}")
        out[m.group(1)] = m.group(2).strip()
    return out


def from_properties(props: dict[str, str], source: str = "--command-config") -> ClientSecurity:
    """ClientSecurity from Kafka client settings (Java or librdkafka names)."""
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        raise ConfigError(f"{source}: security.protocol must be one of {', '.join(_PROTOCOLS)}, got {protocol!r}")
    context = None
    if protocol.endswith("SSL"):
        if "ssl.truststore.location" in props or "ssl.keystore.location" in props:
            raise ConfigError(
                f"{source}: Java key stores are not read here; give PEM files as ssl.ca.location, "
                "ssl.certificate.location and ssl.key.location"
            )
        tls = TlsConfig(
            ca_file=props.get("ssl.ca.location"),
            cert_file=props.get("ssl.certificate.location"),
            key_file=props.get("ssl.key.location"),
        )
        check = props.get("ssl.endpoint.identification.algorithm", "https").lower() == "https"
        context = _node_context(tls, check)
    if not protocol.startswith("SASL"):
        return ClientSecurity(protocol, context)
    mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms", "PLAIN")).upper()
    if mechanism not in CLIENT_SASL_MECHANISMS:
        raise ConfigError(
            f"{source}: sasl.mechanism {mechanism} is not supported here (use one of {CLIENT_SASL_MECHANISMS})"
        )
    token_auth = False
    if "sasl.jaas.config" in props:
        user, password = parse_jaas(props["sasl.jaas.config"], f"{source}: sasl.jaas.config")
        token_auth = re.search(r'\btokenauth\s*=\s*"?true"?', props["sasl.jaas.config"], re.IGNORECASE) is not None
    elif "sasl.username" in props and "sasl.password" in props:
        user, password = props["sasl.username"], props["sasl.password"]
    else:
        raise ConfigError(f"{source}: SASL needs sasl.jaas.config (or sasl.username and sasl.password)")
    if token_auth and not mechanism.startswith("SCRAM"):
        raise ConfigError(f"{source}: a delegation token (tokenauth) authenticates with SCRAM-SHA-256 or SCRAM-SHA-512")
    return ClientSecurity(protocol, context, mechanism, lambda: (user, password), token_auth)
