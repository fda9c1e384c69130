"""Which addresses may receive a call of ours: a pure first-match table, with the reason.

Every range outside public unicast has its class (loopback, private, link-local, cloud
metadata, documentation, ...); an IPv6 address that carries an IPv4 one (IPv4-mapped,
NAT64, 6to4, ...) is judged by the IPv4 address; IPv6 outside global unicast is refused.
``classify`` answers None for an address that may be called, else the ``Verdict`` that
names the class, which the SSRF guard (``outbound.ssrf``) words into its refusal.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class AddressClass(StrEnum):
    """Why an address may not receive callbacks."""

    LOOPBACK = "loopback"
    PRIVATE = "private"
    LINK_LOCAL = "link_local"
    SHARED = "shared"
    CLOUD_METADATA = "cloud_metadata"
    UNSPECIFIED = "unspecified"
    MULTICAST = "multicast"
    BROADCAST = "broadcast"
    RESERVED = "reserved"
    DOCUMENTATION = "documentation"
    BENCHMARKING = "benchmarking"
    PROTOCOL_ASSIGNMENT = "protocol_assignment"
    TEREDO = "teredo"
    SITE_LOCAL = "site_local"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    AddressClass.LOOPBACK: "loopback",
    AddressClass.PRIVATE: "private",
    AddressClass.LINK_LOCAL: "link-local",
    AddressClass.SHARED: "shared (carrier-grade NAT)",
    AddressClass.CLOUD_METADATA: "cloud metadata",
    AddressClass.UNSPECIFIED: "unspecified ('this host')",
    AddressClass.MULTICAST: "multicast",
    AddressClass.BROADCAST: "broadcast",
    AddressClass.RESERVED: "reserved",
    AddressClass.DOCUMENTATION: "documentation",
    AddressClass.BENCHMARKING: "benchmarking",
    AddressClass.PROTOCOL_ASSIGNMENT: "IETF protocol assignment",
    AddressClass.TEREDO: "Teredo tunnel",
    AddressClass.SITE_LOCAL: "site-local",
}


class Rule(NamedTuple):
    network: IPNetwork
    address_class: AddressClass


def _rules(*pairs: tuple[str, AddressClass]) -> tuple[Rule, ...]:
    return tuple(Rule(ipaddress.ip_network(net), cls) for net, cls in pairs)


_C = AddressClass
# First match wins, so a narrow entry sits above the range that contains it.
IPV4_RULES = _rules(
    ("0.0.0.0/8", _C.UNSPECIFIED),
    ("10.0.0.0/8", _C.PRIVATE),
    ("100.100.100.200/32", _C.CLOUD_METADATA),
    ("100.64.0.0/10", _C.SHARED),
    ("127.0.0.0/8", _C.LOOPBACK),
    ("169.254.169.254/32", _C.CLOUD_METADATA),
    ("169.254.0.0/16", _C.LINK_LOCAL),
    ("172.16.0.0/12", _C.PRIVATE),
    ("192.0.0.0/24", _C.PROTOCOL_ASSIGNMENT),
    ("192.0.2.0/24", _C.DOCUMENTATION),
    ("192.88.99.0/24", _C.RESERVED),
    ("192.168.0.0/16", _C.PRIVATE),
    ("198.18.0.0/15", _C.BENCHMARKING),
    ("198.51.100.0/24", _C.DOCUMENTATION),
    ("203.0.113.0/24", _C.DOCUMENTATION),
    ("224.0.0.0/4", _C.MULTICAST),
    ("255.255.255.255/32", _C.BROADCAST),
    ("240.0.0.0/4", _C.RESERVED),
)
# Checked before the IPv4 embeddings below, whose ::/96 contains both.
IPV6_SPECIAL = _rules(
    ("::/128", _C.UNSPECIFIED),
    ("::1/128", _C.LOOPBACK),
)
IPV6_RULES = _rules(
    ("64:ff9b:1::/48", _C.PRIVATE),
    ("100::/64", _C.RESERVED),
    ("2001::/32", _C.TEREDO),
    ("2001:2::/48", _C.BENCHMARKING),
    ("2001:db8::/32", _C.DOCUMENTATION),
    ("2001::/23", _C.PROTOCOL_ASSIGNMENT),
    ("3fff::/20", _C.DOCUMENTATION),
    ("5f00::/16", _C.RESERVED),
    ("fd00:ec2::254/128", _C.CLOUD_METADATA),
    ("fc00::/7", _C.PRIVATE),
    ("fe80::/10", _C.LINK_LOCAL),
    ("fec0::/10", _C.SITE_LOCAL),
    ("ff00::/8", _C.MULTICAST),
)
# Everything outside global unicast is unassigned or special: refuse it.
IPV6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")


class Embedding(NamedTuple):
    """An IPv6 prefix that carries an IPv4 address; the IPv4 address decides."""

    network: ipaddress.IPv6Network
    name: str
    shift: int  # where the 32 embedded bits sit
    public_ok: bool  # whether a public embedded address makes the IPv6 one usable


EMBEDDINGS = (
    Embedding(ipaddress.IPv6Network("::ffff:0:0/96"), "IPv4-mapped", 0, True),
    Embedding(ipaddress.IPv6Network("::ffff:0:0:0/96"), "IPv4-translated", 0, True),
    Embedding(ipaddress.IPv6Network("64:ff9b::/96"), "NAT64", 0, True),
    Embedding(ipaddress.IPv6Network("2002::/16"), "6to4", 80, True),
    # Deprecated (RFC 4291): nothing legitimate uses it any more.
    Embedding(ipaddress.IPv6Network("::/96"), "IPv4-compatible", 0, False),
)


@dataclass(frozen=True)
class Verdict:
    """Why one address is refused."""

    address: IPAddress
    address_class: AddressClass
    embedded: ipaddress.IPv4Address | None = None
    embedding: str | None = None

    def describe(self) -> str:
        label = self.address_class.label
        article = "an" if label[0] in "aeiouAEIOU" else "a"
        text = f"{article} {label} address ({self.address}"
        if self.embedded is not None:
            text += f", the {self.embedding} form of IPv4 {self.embedded}"
        return text + ")"


def _first_match(rules: tuple[Rule, ...], address: IPAddress) -> AddressClass | None:
    for rule in rules:
        if address in rule.network:
            return rule.address_class
    return None


def _classify_v6(address: ipaddress.IPv6Address) -> Verdict | None:
    special = _first_match(IPV6_SPECIAL, address)
    if special is not None:
        return Verdict(address, special)
    for emb in EMBEDDINGS:
        if address in emb.network:
            inner = ipaddress.IPv4Address((int(address) >> emb.shift) & 0xFFFFFFFF)
            inner_class = _first_match(IPV4_RULES, inner)
            if inner_class is not None:
                return Verdict(address, inner_class, inner, emb.name)
            if emb.public_ok:
                return None
            return Verdict(address, AddressClass.RESERVED, inner, emb.name)
    found = _first_match(IPV6_RULES, address)
    if found is not None:
        return Verdict(address, found)
    if address not in IPV6_GLOBAL_UNICAST:
        return Verdict(address, AddressClass.RESERVED)
    return None


def classify(address: IPAddress) -> Verdict | None:
    """None when the address may receive callbacks, else the class that forbids it."""
    if isinstance(address, ipaddress.IPv4Address):
        found = _first_match(IPV4_RULES, address)
        return None if found is None else Verdict(address, found)
    return _classify_v6(address)
