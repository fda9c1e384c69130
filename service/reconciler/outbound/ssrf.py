"""The SSRF guard for agent callback URLs, and for the URLs a provider hands us.

A provider's ``result_ref`` or redirect on a host its file lists passes the same
guard (``providers.result_fetch``; messages name the URL as ``what``). Two moments,
one rule set:

* ``check_url`` when a ``callback_url`` is submitted: syntax, and any address
  written in the URL itself (including the numeric forms ``2130706433``,
  ``0x7f000001``, ``0177.0.0.1``, ``127.1`` that libc and browsers accept).
* ``resolve_and_check`` before every delivery: the host name is resolved again
  (DNS may have been rebound since submission) and the delivery connects only
  to the addresses returned here.

Policy decisions:

* A name that resolves to several addresses is refused when ANY of them is
  forbidden; picking the good one would leave the choice to whoever controls
  the zone.
* ``callbacks.allow_hosts`` entries are either host names (matched against the
  host exactly as written in the URL, case-insensitive, trailing dot ignored;
  a listed name is trusted whatever it resolves to) or IP addresses / CIDR
  networks (``127.0.0.1``, ``10.0.0.0/8``, ``::1``; matched against the literal
  or resolved address). An allow-listed IPv4 network also covers the
  IPv4-mapped IPv6 form of its addresses.
* Address classification is a pure first-match table
  (``outbound.address_classes``); the refusal names the class that matched.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from reconciler.core.errors import ConfigError, ForbiddenAddress, InvalidRequest, ResolutionFailed
from reconciler.outbound.address_classes import (
    AddressClass,
    IPAddress,
    IPNetwork,
    Verdict,
    classify,
)

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

MAX_URL_LENGTH = 2048
SCHEMES = {"http": 80, "https": 443}
CALLBACK = "callback_url"  # how messages name the URL, unless told otherwise
ALLOW_HINT = "such addresses are refused unless listed in callbacks.allow_hosts"


# --- allow-list -------------------------------------------------------------


def _normalise_host(text: str) -> str:
    host = text.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") and len(host) > 1 else host


@dataclass(frozen=True)
class AllowList:
    names: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        names: set[str] = set()
        networks: list[IPNetwork] = []
        for entry in entries:
            text = _normalise_host(entry)
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                if text:
                    names.add(text)
        return cls(frozenset(names), tuple(networks))

    def allows_name(self, host: str) -> bool:
        return _normalise_host(host) in self.names

    def allows_address(self, address: IPAddress) -> bool:
        candidates: list[IPAddress] = [address]
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            candidates.append(address.ipv4_mapped)
        return any(a in net for a in candidates for net in self.networks)


def as_allow_list(allow_hosts: Collection[str] | AllowList) -> AllowList:
    return allow_hosts if isinstance(allow_hosts, AllowList) else AllowList.parse(allow_hosts)


# --- URL syntax -------------------------------------------------------------

# RFC 3986 characters; anything else must be percent-encoded. Refusing the rest
# (spaces, controls, backslash, non-ASCII) removes the parser disagreements
# that SSRF bypasses live on.
_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*")
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_DIGITS = {10: "0123456789", 8: "01234567", 16: "0123456789abcdef"}
MAX_NUMBER_PART = 32


@dataclass(frozen=True)
class CheckedUrl:
    """A callback URL that passed the syntax and literal-address checks."""

    url: str
    scheme: str
    host: str  # lower case, no brackets; the canonical text for a literal address
    port: int  # the effective port
    target: str  # path and query, what the request line carries
    address: IPAddress | None  # set when the host is an address, in whatever form
    allow_listed: bool
    what: str = CALLBACK  # how messages name the URL

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if isinstance(self.address, ipaddress.IPv6Address) else self.host
        return host if self.port == SCHEMES[self.scheme] else f"{host}:{self.port}"


def _ipv4_number(part: str) -> int | None:
    """One dotted part as libc ``inet_aton`` and the WHATWG URL parser read it."""
    text = part.lower()
    base = 10
    if text.startswith("0x"):
        base, text = 16, text[2:]
    elif len(text) > 1 and text.startswith("0"):
        base, text = 8, text[1:]
    if not text:
        return 0 if base == 16 else None
    if len(text) > MAX_NUMBER_PART or any(ch not in _DIGITS[base] for ch in text):
        return None
    return int(text, base)


def _ends_in_number(host: str) -> bool:
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    last = parts[-1]
    return last != "" and (last.isdigit() or _ipv4_number(last) is not None)


def parse_ipv4_host(host: str) -> ipaddress.IPv4Address | None:
    """The address a numeric host means (``127.1``, ``0x7f000001``, ...); None if invalid."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if len(parts) > 4:
        return None
    numbers = [_ipv4_number(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    values = [n for n in numbers if n is not None]
    if any(n > 255 for n in values[:-1]) or values[-1] >= 256 ** (5 - len(values)):
        return None
    total = values[-1]
    for index, value in enumerate(values[:-1]):
        total += value * 256 ** (3 - index)
    return ipaddress.IPv4Address(total)


def _shown(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def _split_authority(netloc: str, what: str) -> tuple[str, bool, str | None]:
    """Host (as written), whether it was bracketed, and the port text (None if absent)."""
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise InvalidRequest(f"{what} has an unclosed '[' in its host")
        rest = netloc[end + 1 :]
        if rest and not rest.startswith(":"):
            raise InvalidRequest(f"{what} has text after the bracketed host")
        return netloc[1:end], True, rest[1:] if rest else None
    host, sep, port = netloc.rpartition(":")
    if not sep:
        return netloc, False, None
    return host, False, port


def _parse_port(text: str | None, scheme: str, what: str) -> int:
    if text is None or text == "":
        return SCHEMES[scheme]
    if not text.isascii() or not text.isdigit() or len(text) > 5 or not 0 < int(text) <= 65535:
        raise InvalidRequest(
            f"{what} port '{_shown(text)}' is not valid; use a number from 1 to 65535"
        )
    return int(text)


def _parse_host(raw: str, bracketed: bool, what: str) -> tuple[str, IPAddress | None]:
    if bracketed:
        try:
            address6 = ipaddress.IPv6Address(raw)
        except ValueError:
            raise InvalidRequest(
                f"{what} host [{_shown(raw)}] is not a valid IPv6 address"
            ) from None
        if "%" in raw:
            raise InvalidRequest(f"{what} may not carry an IPv6 zone (%...)")
        return str(address6), address6
    host = raw.lower()
    if not host:
        raise InvalidRequest(f"{what} has no host; write it as https://host/path")
    if _ends_in_number(host):
        address4 = parse_ipv4_host(host)
        if address4 is None:
            raise InvalidRequest(f"{what} host '{_shown(raw)}' is not a valid IPv4 address")
        return str(address4), address4
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if len(host) > 254 or not all(_LABEL.fullmatch(label) for label in labels):
        raise InvalidRequest(
            f"{what} host '{_shown(raw)}' is not a valid host name; use letters, "
            "digits and hyphens (write an internationalised name in its xn-- form)"
        )
    return host, None


def _syntax(url: str, what: str) -> tuple[str, str, bool, str | None, str]:
    """Scheme, raw host, bracketed, port text, target. Never echoes path or query."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"{what} must be a non-empty string")
    if len(url) > MAX_URL_LENGTH:
        raise InvalidRequest(f"{what} is longer than {MAX_URL_LENGTH} characters")
    if not _URL_CHARS.fullmatch(url):
        raise InvalidRequest(
            f"{what} contains characters that must be percent-encoded "
            "(spaces, control characters, backslashes, quotes, non-ASCII)"
        )
    try:
        parts = urlsplit(url)
    except ValueError:
        raise InvalidRequest(
            f"{what} is not a valid URL; check the brackets around an IPv6 host"
        ) from None
    if parts.scheme not in SCHEMES:
        shown = _shown(parts.scheme) if parts.scheme else "none"
        raise InvalidRequest(f"{what} must use http or https; got scheme '{shown}'")
    if "@" in parts.netloc:
        raise InvalidRequest(
            f"{what} contains user information before '@'; remove it"
            + (" (deliveries are authenticated by their signature)" if what == CALLBACK else "")
        )
    if not parts.netloc:
        raise InvalidRequest(f"{what} has no host; write it as https://host/path")
    host, bracketed, port = _split_authority(parts.netloc, what)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, host, bracketed, port, target


def _refusal(
    written: str, verdict: Verdict, resolved: bool, url_name: str = CALLBACK
) -> ForbiddenAddress:
    what = verdict.describe()
    if resolved:
        lead = f"{url_name} host {_shown(written)} resolves to {what}"
    elif written != str(verdict.address):
        lead = f"{url_name} host {_shown(written)} means {what}"
    else:
        lead = f"{url_name} points to {what}"
    return ForbiddenAddress(f"{lead}; {ALLOW_HINT}", verdict)


def _is_localhost(host: str) -> bool:
    name = _normalise_host(host)
    return name == "localhost" or name.endswith(".localhost")


def check_url(
    url: str, allow_hosts: Collection[str] | AllowList, what: str = CALLBACK
) -> CheckedUrl:
    """Check a URL without resolving it; raises ``InvalidRequest`` saying what to fix.

    ``what`` names the URL in messages: an agent's ``callback_url``, or a URL a provider
    handed us (``result_ref``, a redirect), which passes the same guard."""
    allow = as_allow_list(allow_hosts)
    scheme, raw_host, bracketed, port_text, target = _syntax(url, what)
    port = _parse_port(port_text, scheme, what)
    host, address = _parse_host(raw_host, bracketed, what)
    if address is not None:
        allowed = allow.allows_address(address)
        verdict = classify(address)
        if verdict is not None and not allowed:
            raise _refusal(raw_host, verdict, resolved=False, url_name=what)
    else:
        allowed = allow.allows_name(host)
        loopback = ipaddress.IPv4Address("127.0.0.1")
        # RFC 6761: these names are loopback by definition; say so now, not at delivery.
        if _is_localhost(host) and not allowed and not allow.allows_address(loopback):
            raise _refusal(
                raw_host, Verdict(loopback, AddressClass.LOOPBACK), resolved=True, url_name=what
            )
    return CheckedUrl(url, scheme, host, port, target, address, allowed, what)


# --- resolution -------------------------------------------------------------


def _parse_resolved(texts: Sequence[str]) -> list[IPAddress]:
    seen: dict[IPAddress, None] = {}
    for text in texts:
        try:
            seen.setdefault(ipaddress.ip_address(str(text).split("%", 1)[0]), None)
        except ValueError:
            raise ResolutionFailed(
                "the resolver returned something that is not an IP address"
            ) from None
    return list(seen)


def check_resolved(
    checked: CheckedUrl, addresses: Sequence[IPAddress], allow_hosts: Collection[str] | AllowList
) -> list[IPAddress]:
    """Pure: the addresses to connect to, or ``ForbiddenAddress`` if any one is refused."""
    allow = as_allow_list(allow_hosts)
    if not addresses:
        raise ResolutionFailed(f"{checked.what} host {_shown(checked.host)} has no addresses")
    if checked.address is None and allow.allows_name(checked.host):
        return list(addresses)
    for address in addresses:
        verdict = classify(address)
        if verdict is not None and not allow.allows_address(address):
            raise _refusal(
                checked.host, verdict, resolved=checked.address is None, url_name=checked.what
            )
    return list(addresses)


async def system_resolver(host: str, port: int) -> list[str]:
    """The platform resolver (``getaddrinfo``), TCP addresses only."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


async def resolve_checked(
    checked: CheckedUrl, allow_hosts: Collection[str] | AllowList, resolver: Resolver
) -> list[IPAddress]:
    if checked.address is not None:
        return check_resolved(checked, [checked.address], allow_hosts)
    try:
        texts = await resolver(checked.host, checked.port)
    except (OSError, UnicodeError):
        raise ResolutionFailed(
            f"{checked.what} host {_shown(checked.host)} could not be resolved"
        ) from None
    return check_resolved(checked, _parse_resolved(texts), allow_hosts)


async def resolve_and_check(
    url: str,
    allow_hosts: Collection[str] | AllowList,
    resolver: Resolver = system_resolver,
    what: str = CALLBACK,
) -> list[IPAddress]:
    """Check the URL, resolve its host now, refuse if ANY address is forbidden.

    Returns the addresses (resolver order, duplicates removed) that a delivery
    may connect to. Raises ``InvalidRequest`` (``ForbiddenAddress`` for an
    address refusal) or ``ResolutionFailed``.
    """
    allow = as_allow_list(allow_hosts)
    return await resolve_checked(check_url(url, allow, what), allow, resolver)


def validate_allow_hosts(entries: Iterable[str]) -> None:
    """For the config loader: an entry that looks like a CIDR must parse as one."""
    for entry in entries:
        text = _normalise_host(entry)
        if "/" in text:
            try:
                ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise ConfigError(
                    f"callbacks.allow_hosts entry '{_shown(entry)}' is not a valid network; "
                    "write a host name, an IP address or a CIDR such as 10.0.0.0/8"
                ) from None
