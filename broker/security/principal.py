"""Principals: the `User:NAME` strings authorizers and quotas key on.

A TLS client certificate's subject becomes a name through Kafka's
`ssl.principal.mapping.rules`: a list of `RULE:pattern/replacement/[LU]` entries and
`DEFAULT`, tried in order against the subject DN in RFC 2253 form (`CN=alice,O=acme,C=US`,
most specific first, as Java's X500Principal.getName() prints it). A rule applies when its
pattern matches the whole DN; `$1`... in the replacement are its groups; a trailing `/L` or
`/U` lower- or upper-cases the result. `DEFAULT` is the DN unchanged. No rule matching is an
authentication failure, as in Kafka.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ANONYMOUS = "User:ANONYMOUS"

_RULE = re.compile(r"^RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU])?$")


class PrincipalMappingError(ValueError):
    """No mapping rule matched the certificate subject."""


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str | None = None

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        m = self.pattern.fullmatch(dn)
        if m is None:
            return None
        # Java's $1 group references; a literal $ is written \$
        out = re.sub(
            r"\\\$|\$(\d+)", lambda g: "$" if g.group(1) is None else (m.group(int(g.group(1))) or ""), self.replacement
        )
        if self.case == "L":
            out = out.lower()
        elif self.case == "U":
            out = out.upper()
        return out


def parse_rules(rules: list[str]) -> list[_Rule]:
    """ValueError naming the bad rule, so config errors say which entry is wrong."""
    parsed = []
    for raw in rules:
        text = raw.strip()
        if text == "DEFAULT":
            parsed.append(_Rule(None))
            continue
        m = _RULE.match(text)
        if m is None:
            raise ValueError(
                f"tls.principal_mapping_rules: {raw!r} is neither DEFAULT nor RULE:pattern/replacement/[LU]"
            )
        try:
            pattern = re.compile(m.group(1).replace("\\/", "/"))
        except re.error as exc:
            raise ValueError(f"tls.principal_mapping_rules: bad pattern in {raw!r}: {exc}") from exc
        parsed.append(_Rule(pattern, m.group(2).replace("\\/", "/"), m.group(3)))
    return parsed


class PrincipalMapper:
    def __init__(self, rules: list[str]) -> None:
        self.rules = parse_rules(rules or ["DEFAULT"])

    def name_for(self, dn: str) -> str:
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        raise PrincipalMappingError(f"no tls.principal_mapping_rules entry matches the certificate subject {dn!r}")


def subject_dn(der_certificate: bytes) -> str:
    """The certificate's subject in RFC 2253 form (RFC 4514 is the same format)."""
    from cryptography import x509  # here, not at import: only mTLS listeners need it

    return x509.load_der_x509_certificate(der_certificate).subject.rfc4514_string()
