"""``console.return_to``: whatever a ``next`` holds, the answer is a console page or the inbox,
written so that no reader resolves it anywhere else."""

from __future__ import annotations

import posixpath
from urllib.parse import unquote, urljoin, urlsplit

from hypothesis import example, given
from hypothesis import strategies as st

from reconciler.console.return_to import remove_dot_segments, return_to

# The pieces paths are made of, bad ones included, in every spelling.
PIECES = st.sampled_from(
    [
        "/",
        "//",
        "\\",
        "console",
        "/console",
        "v1",
        "operations",
        "sign-in",
        "static",
        ".",
        "..",
        "%2e",
        "%2E",
        "%2e%2e",
        "%252e",
        "%2f",
        "%2F",
        "%5c",
        "%25",
        "%",
        "?",
        "&",
        "=",
        "#",
        "@",
        ":",
        "evil.example",
        "https:",
        " ",
        "\t",
        "op_1",
        "x",
    ]
)
NEXTS = st.lists(PIECES, max_size=12).map("".join) | st.text(max_size=40)
BASE = "http://svc.local/console/sign-in"


def _fully_decoded(path: str) -> str:
    for _ in range(8):
        path = unquote(path)
    return path


@given(NEXTS)
@example("/console/../v1/operations")
@example("/console/%2e%2e/v1/operations")
@example("/console/%252e%252e/v1")
@example("/console\\..\\v1")
@example("//evil.example/console")
def test_the_answer_is_a_console_page_however_it_is_read(raw: str) -> None:
    target = return_to(raw)
    assert target.startswith("/console")
    path = urlsplit(target).path
    assert "\\" not in target and "//" not in path and "#" not in target
    # A browser resolving it (RFC 3986) stays on this site, under /console.
    landed = urlsplit(urljoin(BASE, target))
    assert landed.netloc == "svc.local" and landed.path == path
    # A server decoding it once, or a proxy decoding it again, reads no dot segment either.
    for reading in (unquote(path), _fully_decoded(path)):
        assert reading == "/console" or reading.startswith("/console/")
        assert "/../" not in reading + "/" and "/./" not in reading + "/"
        assert posixpath.normpath(reading) == reading.rstrip("/") or reading == "/console"


@given(NEXTS)
@example("/console/.")  # a trailing dot segment leaves a "/" a second reading drops
def test_the_answer_is_stable(raw: str) -> None:
    once = return_to(raw)
    assert return_to(once) == once


def test_dot_segments_follow_rfc_3986() -> None:
    # RFC 3986 5.4 abnormal examples, on a path.
    assert remove_dot_segments("/a/b/c/./../../g") == "/a/g"
    assert remove_dot_segments("/../../g") == "/g"
    assert remove_dot_segments("/a/..") == "/"
    assert remove_dot_segments("/a/b/.") == "/a/b/"
    assert remove_dot_segments("/a/b/../") == "/a/"


def test_the_sign_in_pages_and_static_files_are_not_destinations() -> None:
    for raw in ("/console/sign-in", "/console/sign-out", "/console/static/app.css"):
        assert return_to(raw) == "/console"
    assert return_to("/console/sign-ins") == "/console/sign-ins"  # a 404 page, still a page
