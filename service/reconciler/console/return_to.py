"""Where the console sends an operator after signing in: a console page, resolved first.

Guarantee: the answer is ``/console`` (the inbox) or the path of a console page, written
so that every browser and every server reads the same path. A ``next`` is resolved the
way they would resolve it before it is judged: backslashes read as slashes (as browsers
read them in http URLs), percent-encoded characters decoded (also when encoded twice,
``%252e``), dot segments removed (RFC 3986, 5.2.4). ``/console/../v1/operations`` is
``/v1/operations``, not a console page, and goes to the inbox; so does anything with a
scheme, a host (``//evil.example``), a control character, or the sign-in pages and
static files themselves.
"""

from __future__ import annotations

from urllib.parse import quote, unquote, urlsplit

from reconciler.console.web import PREFIX

# Console paths that are not pages to land on.
NOT_PAGES = (f"{PREFIX}/sign-in", f"{PREFIX}/sign-out", f"{PREFIX}/static")
MAX_CHARS = 2000
# Enough for any honest path; a path still changing after this many decodes is refused.
MAX_DECODES = 4
# What may stay unescaped in the path we answer with (RFC 3986 pchar and "/", less "%").
_PATH_SAFE = "/-._~!$&'()*+,;=:@"


def remove_dot_segments(path: str) -> str:
    """RFC 3986, 5.2.4: ``/a/./b/../c`` is ``/a/c``; nothing climbs above the root."""
    out: list[str] = []
    segments = path.split("/")
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "..":
            if len(out) > 1:
                out.pop()
            if last:
                out.append("")
        elif segment == ".":
            if last:
                out.append("")
        else:
            out.append(segment)
    resolved = "/".join(out)
    return resolved if resolved.startswith("/") else "/" + resolved


def _decoded(path: str) -> str | None:
    """``path`` with every percent-encoding undone, or None if it never settles."""
    for _ in range(MAX_DECODES):
        plain = unquote(path, errors="strict")
        if plain == path:
            return path
        path = plain
    return None


def _is_page(path: str) -> bool:
    if path != PREFIX and not path.startswith(PREFIX + "/"):
        return False
    return not any(path == p or path.startswith(p + "/") for p in NOT_PAGES)


def return_to(raw: str | None) -> str:
    """The console page ``raw`` names once resolved, or the inbox."""
    if not raw or len(raw) > MAX_CHARS or any(not c.isprintable() for c in raw):
        return PREFIX
    text = raw.replace("\\", "/")
    if not text.startswith("/") or text.startswith("//"):
        return PREFIX
    try:
        parts = urlsplit(text)
        path = _decoded(parts.path)
    except (ValueError, UnicodeDecodeError):
        return PREFIX
    if parts.scheme or parts.netloc or path is None or any(not c.isprintable() for c in path):
        return PREFIX
    # "//" inside the path is kept as one "/": no resolver can then read a host from it.
    resolved = remove_dot_segments("/" + "/".join(s for s in path.split("/") if s))
    # A trailing "." or ".." leaves a trailing "/", which a second reading would drop as
    # an empty segment: dropped here, the answer is the same read once or twice.
    resolved = resolved.rstrip("/") or "/"
    if not _is_page(resolved):
        return PREFIX
    query = parts.query
    if query and _decoded(query) is None:
        return PREFIX
    target = quote(resolved, safe=_PATH_SAFE)
    return f"{target}?{quote(query, safe='&=+%/:@-._~!$()*,;')}" if query else target
