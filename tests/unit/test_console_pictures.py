"""The console's pictures in the docs are the ones the browser test takes, all of them.

docs/operations.md shows each page at both widths (``tests/support/screenshots.SHOTS``);
a picture the test no longer takes, or one it takes that no page shows, fails here.
"""

from __future__ import annotations

import re

from tests.support.screenshots import DOCS, SHOTS, SIGNATURE

OPERATIONS = DOCS.parents[0] / "operations.md"


def test_operations_shows_every_picture_the_browser_test_takes() -> None:
    shown = re.findall(r"!\[[^\]]+\]\(console/([^)]+\.png)\)", OPERATIONS.read_text())
    assert sorted(shown) == sorted(SHOTS)
    assert sorted(p.name for p in DOCS.glob("*.png")) == sorted(SHOTS)
    for name in SHOTS:
        assert (DOCS / name).read_bytes()[:8] == SIGNATURE
    # Small enough to keep in the repository: a few hundred KB in all.
    assert sum((DOCS / name).stat().st_size for name in SHOTS) < 600_000
