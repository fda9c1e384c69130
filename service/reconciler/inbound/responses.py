"""The JSON answer of the agent API: stored text never makes it fail to encode.

Starlette's ``JSONResponse`` writes UTF-8, which a lone surrogate cannot be written in;
one stored before provider answers were checked (docs/design.md#provider-text) would make
every door that shows it answer 500. Such an answer is written again with the text as a
visible escape (``core.strict_json.visible``); every other answer costs nothing more.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse as _StarletteJSON

from reconciler.core.strict_json import visible


class JSONResponse(_StarletteJSON):
    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(visible(content))
