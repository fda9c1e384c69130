"""The SSRF guard: URL syntax, address classes, numeric host forms, allow-list, resolution."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.errors import ConfigError, ForbiddenAddress, InvalidRequest, ResolutionFailed
from reconciler.outbound.address_classes import AddressClass, classify
from reconciler.outbound.ssrf import (
    AllowList,
    CheckedUrl,
    Resolver,
    check_url,
    parse_ipv4_host,
    resolve_and_check,
    validate_allow_hosts,
)

C = AddressClass

REFUSED = [
    ("http://127.0.0.1/", C.LOOPBACK, "127.0.0.1"),
    ("http://10.0.0.1/", C.PRIVATE, "10.0.0.1"),
    ("http://172.16.5.4/", C.PRIVATE, "172.16.5.4"),
    ("http://192.168.1.1/", C.PRIVATE, "192.168.1.1"),
    ("http://169.254.169.254/latest/meta-data/", C.CLOUD_METADATA, "169.254.169.254"),
    ("http://169.254.1.1/", C.LINK_LOCAL, "169.254.1.1"),
    ("http://[::1]/", C.LOOPBACK, "::1"),
    ("http://[::ffff:127.0.0.1]/", C.LOOPBACK, "127.0.0.1"),
    ("http://[::ffff:169.254.169.254]/", C.CLOUD_METADATA, "169.254.169.254"),
    ("http://2130706433/", C.LOOPBACK, "127.0.0.1"),
    ("http://0x7f000001/", C.LOOPBACK, "127.0.0.1"),
    ("http://0X7F.1/", C.LOOPBACK, "127.0.0.1"),
    ("http://0177.0.0.1/", C.LOOPBACK, "127.0.0.1"),
    ("http://127.1/", C.LOOPBACK, "127.0.0.1"),
    ("http://127.0.1/", C.LOOPBACK, "127.0.0.1"),
    ("http://127.0.0.1./", C.LOOPBACK, "127.0.0.1"),
    ("http://0/", C.UNSPECIFIED, "0.0.0.0"),
    ("http://[fd00:ec2::254]/", C.CLOUD_METADATA, "fd00:ec2::254"),
    ("http://[fd12:3456::1]/", C.PRIVATE, "fd12:3456::1"),
    ("http://[fe80::1]/", C.LINK_LOCAL, "fe80::1"),
    ("http://[fec0::1]/", C.SITE_LOCAL, "fec0::1"),
    ("http://100.64.0.1/", C.SHARED, "100.64.0.1"),
    ("http://100.100.100.200/", C.CLOUD_METADATA, "100.100.100.200"),
    ("http://0.0.0.0/", C.UNSPECIFIED, "0.0.0.0"),
    ("http://[::]/", C.UNSPECIFIED, "::"),
    ("http://224.0.0.1/", C.MULTICAST, "224.0.0.1"),
    ("http://[ff02::1]/", C.MULTICAST, "ff02::1"),
    ("http://255.255.255.255/", C.BROADCAST, "255.255.255.255"),
    ("http://240.0.0.1/", C.RESERVED, "240.0.0.1"),
    ("http://192.0.2.10/", C.DOCUMENTATION, "192.0.2.10"),
    ("http://198.51.100.7/", C.DOCUMENTATION, "198.51.100.7"),
    ("http://203.0.113.9/", C.DOCUMENTATION, "203.0.113.9"),
    ("http://[2001:db8::1]/", C.DOCUMENTATION, "2001:db8::1"),
    ("http://198.18.0.1/", C.BENCHMARKING, "198.18.0.1"),
    ("http://198.19.255.254/", C.BENCHMARKING, "198.19.255.254"),
    ("http://192.0.0.8/", C.PROTOCOL_ASSIGNMENT, "192.0.0.8"),
    ("http://[64:ff9b::a00:1]/", C.PRIVATE, "10.0.0.1"),
    ("http://[64:ff9b::7f00:1]/", C.LOOPBACK, "127.0.0.1"),
    ("http://[2002:a00:1::1]/", C.PRIVATE, "10.0.0.1"),
    ("http://[::127.0.0.1]/", C.LOOPBACK, "127.0.0.1"),
    ("http://[::8.8.8.8]/", C.RESERVED, "8.8.8.8"),
    ("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", C.TEREDO, "2001:0:4136"),
    ("http://[100::1]/", C.RESERVED, "100::1"),
    ("http://[::2]/", C.UNSPECIFIED, "0.0.0.2"),
    ("http://[4000::1]/", C.RESERVED, "4000::1"),
    ("http://localhost:8080/cb", C.LOOPBACK, "localhost"),
    ("http://api.LOCALHOST/cb", C.LOOPBACK, "localhost"),
]


@pytest.mark.parametrize(("url", "cls", "shown"), REFUSED)
def test_forbidden_addresses_are_refused_with_their_class(
    url: str, cls: AddressClass, shown: str
) -> None:
    with pytest.raises(ForbiddenAddress) as info:
        check_url(url, [])
    assert info.value.verdict.address_class is cls
    assert isinstance(info.value, InvalidRequest)
    message = info.value.message
    assert cls.label in message
    assert shown in message.lower()
    assert "callbacks.allow_hosts" in message


def test_refusal_message_says_what_and_what_to_do() -> None:
    with pytest.raises(InvalidRequest) as info:
        check_url("http://10.0.0.1/hook", [])
    assert info.value.message == (
        "callback_url points to a private address (10.0.0.1); such addresses are "
        "refused unless listed in callbacks.allow_hosts"
    )


SYNTAX = [
    ("ftp://example.com/", "http or https"),
    ("file:///etc/passwd", "http or https"),
    ("gopher://example.com/", "http or https"),
    ("example.com/hook", "http or https"),
    ("http://user:pass@example.com/", "user information"),
    ("http://user@example.com/", "user information"),
    ("http://evil.com\\@127.0.0.1/", "percent-encoded"),
    ("http:///hook", "no host"),
    ("http://:80/hook", "no host"),
    ("http://example.com:0/", "port"),
    ("http://example.com:65536/", "port"),
    ("http://example.com:8o/", "port"),
    ("http://example.com:-1/", "port"),
    ("http://999.1.1.1/", "not a valid IPv4"),
    ("http://1.2.3.4.5/", "not a valid IPv4"),
    ("http://4294967296/", "not a valid IPv4"),
    ("http://09.1.1.1/", "not a valid IPv4"),
    ("http://[fe80::1%25eth0]/", "zone"),
    ("http://[127.0.0.1]/", "brackets"),
    ("http://[::1/", "brackets"),
    ("http://ex ample.com/", "percent-encoded"),
    ("http://exa\tmple.com/", "percent-encoded"),
    ("http://bücher.example/", "percent-encoded"),
    ("http://%31%32%37.0.0.1/", "is not a valid"),
    ("http://-" + "a" * 70 + ".example/", "not a valid host name"),
    ("", "non-empty"),
    ("http://example.com/" + "a" * 3000, "longer than"),
]


@pytest.mark.parametrize(("url", "fragment"), SYNTAX)
def test_malformed_urls_are_rejected_with_a_reason(url: str, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_url(url, ["127.0.0.1", "example.com"])
    assert fragment in info.value.message


def test_userinfo_is_not_echoed() -> None:
    with pytest.raises(InvalidRequest) as info:
        check_url("https://agent:s3cret-token@example.com/hook", [])
    assert "s3cret" not in info.value.message


def test_path_and_query_are_never_echoed() -> None:
    with pytest.raises(InvalidRequest) as info:
        check_url("http://10.0.0.1/hook?token=s3cret", [])
    assert "s3cret" not in info.value.message


@pytest.mark.parametrize(
    "url",
    [
        "http://93.184.216.34/",
        "https://[2606:4700::1111]/hook",
        "https://example.com/hook?x=1",
        "HTTPS://Example.COM:8443/a/b?c=d#frag",
        "http://[::ffff:93.184.216.34]/",
        "http://[64:ff9b::5db8:d822]/",
        "http://[2002:5db8:d822::1]/",
        "http://1.1/",
    ],
)
def test_public_destinations_are_accepted(url: str) -> None:
    checked = check_url(url, [])
    assert checked.allow_listed is False


def test_checked_url_parts() -> None:
    checked = check_url("HTTPS://Example.COM:8443/a/b?c=d#frag", [])
    assert checked == CheckedUrl(
        url="HTTPS://Example.COM:8443/a/b?c=d#frag",
        scheme="https",
        host="example.com",
        port=8443,
        target="/a/b?c=d",
        address=None,
        allow_listed=False,
    )
    assert checked.host_header == "example.com:8443"
    assert check_url("https://example.com", []).target == "/"
    assert check_url("https://example.com:443/", []).host_header == "example.com"
    six = check_url("http://[2606:4700::1111]:8080/", [])
    assert six.host_header == "[2606:4700::1111]:8080"
    assert six.address == ipaddress.ip_address("2606:4700::1111")


def test_numeric_forms_are_normalised_like_libc() -> None:
    assert check_url("http://1.1/", []).address == ipaddress.ip_address("1.0.0.1")
    assert check_url("http://0x5db8d822/", []).host == "93.184.216.34"
    forms = [
        "2130706433",
        "0x7f000001",
        "0177.0.0.1",
        "127.1",
        "127.0.1",
        "0x7f.0.0.1",
        "127.0.0.1.",
    ]
    for form in forms:
        assert parse_ipv4_host(form) == ipaddress.IPv4Address("127.0.0.1"), form
    for bad in ["256.1.1.1", "1.2.3.4.5", "08", "0x1g", "1..1", "4294967296"]:
        assert parse_ipv4_host(bad) is None, bad


# --- allow-list --------------------------------------------------------------


def test_allow_listed_address_is_accepted() -> None:
    checked = check_url("http://127.0.0.1:8080/hook", ["127.0.0.1"])
    assert checked.allow_listed is True
    assert checked.address == ipaddress.ip_address("127.0.0.1")


def test_allow_list_by_address_covers_every_spelling_of_it() -> None:
    for url in ["http://127.1/", "http://2130706433/", "http://[::ffff:127.0.0.1]/"]:
        assert check_url(url, ["127.0.0.1"]).allow_listed is True
    with pytest.raises(ForbiddenAddress):
        check_url("http://127.0.0.2/", ["127.0.0.1"])


def test_allow_list_cidr_and_bracketed_ipv6() -> None:
    assert check_url("http://10.1.2.3/", ["10.0.0.0/8"]).allow_listed is True
    assert check_url("http://[::1]:9000/", ["[::1]"]).allow_listed is True
    with pytest.raises(ForbiddenAddress):
        check_url("http://192.168.0.1/", ["10.0.0.0/8"])


def test_allow_list_names_are_exact_and_case_insensitive() -> None:
    allow = ["Callbacks.Example."]
    assert check_url("https://CALLBACKS.example/cb", allow).allow_listed is True
    assert check_url("https://callbacks.example./cb", allow).allow_listed is True
    assert check_url("https://x.callbacks.example/cb", allow).allow_listed is False


def test_a_listed_name_does_not_list_its_address_literal() -> None:
    with pytest.raises(ForbiddenAddress):
        check_url("http://127.0.0.1/", ["localhost"])
    assert check_url("http://localhost/", ["localhost"]).allow_listed is True
    assert check_url("http://localhost/", ["127.0.0.1"]).allow_listed is False


def test_allow_list_parse() -> None:
    allow = AllowList.parse(["127.0.0.1", " Hooks.Example ", "10.0.0.0/8", "", "[::1]"])
    assert allow.names == frozenset({"hooks.example"})
    assert len(allow.networks) == 3


def test_validate_allow_hosts() -> None:
    validate_allow_hosts(["127.0.0.1", "10.0.0.0/8", "hooks.example", "::1"])
    with pytest.raises(ConfigError, match="10.0.0.0/33"):
        validate_allow_hosts(["10.0.0.0/33"])


# --- resolution ---------------------------------------------------------------


def fake_resolver(table: Mapping[str, Sequence[str]], calls: list[str] | None = None) -> Resolver:
    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(table[host])

    return resolve


def resolve(url: str, allow: list[str], table: Mapping[str, Sequence[str]]) -> list[str]:
    addresses = asyncio.run(resolve_and_check(url, allow, fake_resolver(table)))
    return [str(a) for a in addresses]


def test_name_resolving_to_private_address_is_refused() -> None:
    with pytest.raises(ForbiddenAddress) as info:
        resolve("https://callbacks.example/cb", [], {"callbacks.example": ["10.0.0.1"]})
    assert info.value.verdict.address_class is C.PRIVATE
    assert info.value.message == (
        "callback_url host callbacks.example resolves to a private address (10.0.0.1); "
        "such addresses are refused unless listed in callbacks.allow_hosts"
    )


def test_name_resolving_to_public_and_private_is_refused() -> None:
    table = {"callbacks.example": ["93.184.216.34", "2606:4700::1111", "169.254.169.254"]}
    with pytest.raises(ForbiddenAddress) as info:
        resolve("https://callbacks.example/cb", [], table)
    assert info.value.verdict.address_class is C.CLOUD_METADATA


def test_name_resolving_to_public_addresses_returns_them_in_order_without_duplicates() -> None:
    table = {"callbacks.example": ["93.184.216.34", "2606:4700::1111", "93.184.216.34"]}
    got = resolve("https://callbacks.example/cb", [], table)
    assert got == ["93.184.216.34", "2606:4700::1111"]


def test_resolved_ipv6_scope_is_dropped() -> None:
    got = resolve("https://h.example/", [], {"h.example": ["2606:4700::1111%3"]})
    assert got == ["2606:4700::1111"]


def test_allow_listed_name_is_trusted_whatever_it_resolves_to() -> None:
    table = {"callbacks.example": ["127.0.0.1", "10.0.0.1"]}
    assert resolve("http://callbacks.example/", ["callbacks.example"], table) == [
        "127.0.0.1",
        "10.0.0.1",
    ]


def test_allow_listed_network_covers_resolved_addresses() -> None:
    table = {"callbacks.example": ["127.0.0.1", "127.0.0.2"]}
    assert resolve("http://callbacks.example/", ["127.0.0.0/8"], table) == [
        "127.0.0.1",
        "127.0.0.2",
    ]
    with pytest.raises(ForbiddenAddress):
        resolve("http://callbacks.example/", ["127.0.0.1"], table)


def test_literal_address_is_not_resolved() -> None:
    calls: list[str] = []
    got = asyncio.run(resolve_and_check("http://93.184.216.34/", [], fake_resolver({}, calls)))
    assert got == [ipaddress.ip_address("93.184.216.34")]
    assert calls == []


def test_every_check_resolves_again() -> None:
    calls: list[str] = []
    resolver = fake_resolver({"h.example": ["93.184.216.34"]}, calls)
    for _ in range(3):
        asyncio.run(resolve_and_check("http://h.example/", [], resolver))
    assert calls == ["h.example"] * 3


def test_resolution_failures() -> None:
    with pytest.raises(ResolutionFailed, match="could not be resolved"):
        resolve("http://nowhere.example/", [], {})
    with pytest.raises(ResolutionFailed, match="no addresses"):
        resolve("http://empty.example/", [], {"empty.example": []})
    with pytest.raises(ResolutionFailed, match="not an IP address"):
        resolve("http://odd.example/", [], {"odd.example": ["not-an-ip"]})


def test_syntax_is_checked_before_resolving() -> None:
    calls: list[str] = []
    with pytest.raises(InvalidRequest, match="user information"):
        asyncio.run(resolve_and_check("http://a:b@h.example/", [], fake_resolver({}, calls)))
    assert calls == []


# --- properties ---------------------------------------------------------------

ipv4s = st.integers(min_value=0, max_value=2**32 - 1).map(ipaddress.IPv4Address)
ipv6s = st.integers(min_value=0, max_value=2**128 - 1).map(ipaddress.IPv6Address)


@given(ipv4s)
def test_accepted_ipv4_is_global_unicast(address: ipaddress.IPv4Address) -> None:
    if classify(address) is None:
        assert address.is_global and not address.is_multicast


@given(ipv4s)
def test_embedded_ipv4_is_judged_by_the_ipv4_address(address: ipaddress.IPv4Address) -> None:
    plain = classify(address)
    for prefix in (0xFFFF << 32, 0x64FF9B << 96):
        verdict = classify(ipaddress.IPv6Address(prefix | int(address)))
        if plain is None:
            assert verdict is None
        else:
            assert verdict is not None
            assert verdict.address_class is plain.address_class
            assert verdict.embedded == address


@given(ipv6s)
def test_accepted_ipv6_is_global_unicast_or_carries_a_public_ipv4(
    address: ipaddress.IPv6Address,
) -> None:
    if classify(address) is None:
        in_global = address in ipaddress.IPv6Network("2000::/3")
        assert in_global or address.ipv4_mapped is not None or address.is_global


URLISH = st.text(
    alphabet=st.sampled_from([*"htps:/[]@.0x127fFe%:-_?#abc19 \\\t", "é", "\x00"]),
    max_size=40,
)


@given(st.one_of(st.text(max_size=60), URLISH, st.builds("http://{}/".format, URLISH)))
def test_check_url_only_ever_raises_invalid_request(url: str) -> None:
    try:
        checked = check_url(url, ["127.0.0.1", "hooks.example"])
    except InvalidRequest:
        return
    assert checked.scheme in {"http", "https"}
    assert 0 < checked.port <= 65535
    if checked.address is not None:
        assert classify(checked.address) is None or checked.allow_listed
