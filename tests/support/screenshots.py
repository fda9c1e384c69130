"""The console's pictures in docs/: which there are, and how they are kept small.

``SHOTS`` names every picture the browser test (tests/integration/test_console_browser.py)
takes of the console, each page at a desktop's and a phone's width; docs/operations.md
shows them all, from ``DOCS``, where the test writes them when asked
(``RECONCILER_DOC_SCREENSHOTS=1``), so they cannot go stale unnoticed.

A screen of the console holds few colours; text smoothing adds shades of them. The browser
that took the picture keeps its 256 most frequent colours (every other pixel takes the
nearest of them), and the pixels are written here as an indexed PNG: about a third of
the browser's own file, with nothing a reader would notice.
"""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path
from typing import Any

SIGNATURE = b"\x89PNG\r\n\x1a\n"
COLOURS = 256
DOCS = Path(__file__).resolve().parents[2] / "docs" / "console"
WIDTHS = {"desktop": {"width": 1440, "height": 900}, "phone": {"width": 390, "height": 844}}
PAGES = ("inbox", "operation", "confirm", "providers", "audit", "story")
SHOTS = tuple(f"{name}-{width}.png" for name in PAGES for width in WIDTHS)

# In the page: the PNG decoded onto a canvas, its palette, each pixel's index (base64).
_QUANTIZE = """async ([b64, most]) => {
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const bitmap = await createImageBitmap(new Blob([bytes], { type: "image/png" }));
  const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
  const draw = canvas.getContext("2d");
  draw.drawImage(bitmap, 0, 0);
  const pixels = new Uint32Array(
    draw.getImageData(0, 0, bitmap.width, bitmap.height).data.buffer);
  const counts = new Map();
  for (const p of pixels) counts.set(p, (counts.get(p) || 0) + 1);
  const kept = [...counts.entries()].sort((a, b) => b[1] - a[1]).slice(0, most)
    .map(entry => entry[0]);
  const rgb = p => [p & 255, (p >>> 8) & 255, (p >>> 16) & 255];
  const palette = kept.map(rgb);
  const index = new Map(kept.map((p, i) => [p, i]));
  const out = new Uint8Array(pixels.length);
  for (let i = 0; i < pixels.length; i++) {
    let found = index.get(pixels[i]);
    if (found === undefined) {
      const [r, g, b] = rgb(pixels[i]);
      let best = Infinity;
      palette.forEach(([pr, pg, pb], j) => {
        const d = (pr - r) ** 2 + (pg - g) ** 2 + (pb - b) ** 2;
        if (d < best) { best = d; found = j; }
      });
      index.set(pixels[i], found);
    }
    out[i] = found;
  }
  let text = "";
  for (let i = 0; i < out.length; i += 0x8000) {
    text += String.fromCharCode.apply(null, out.subarray(i, i + 0x8000));
  }
  return [bitmap.width, bitmap.height, palette, btoa(text)];
}"""


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def indexed_png(width: int, height: int, palette: list[list[int]], indices: bytes) -> bytes:
    """An 8-bit indexed PNG of ``width`` x ``height`` pixels (each row unfiltered)."""
    if len(indices) != width * height or not 0 < len(palette) <= COLOURS:
        raise ValueError("the indices do not fill the picture, or the palette is not 1-256")
    rows = b"".join(b"\x00" + indices[y * width : (y + 1) * width] for y in range(height))
    return (
        SIGNATURE
        + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0))
        + _chunk(b"PLTE", bytes(value for colour in palette for value in colour))
        + _chunk(b"IDAT", zlib.compress(rows, 9))
        + _chunk(b"IEND", b"")
    )


def small_png(page: Any, png: bytes) -> bytes:
    """``png`` (a screenshot ``page``'s browser took) with a palette of at most 256 colours."""
    encoded = base64.b64encode(png).decode("ascii")
    width, height, palette, indices = page.evaluate(_QUANTIZE, [encoded, COLOURS])
    return indexed_png(int(width), int(height), palette, base64.b64decode(indices))
