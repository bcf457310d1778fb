"""A PDF's text is read in a process of its own, bounded in time and memory (D351).

A 14 KB PDF whose 50 pages share one content stream just under pypdf's limits cost about 8 s
of CPU a page: its read held a worker slot for minutes, and a process past its stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from pathlib import Path

import pytest

from gateway.file_text import PdfNotRead, read_pdf
from tests.support.file_samples import pdf


def slow_pdf(pages: int = 50, megabytes: float = 3.7) -> bytes:
    """`pages` pages sharing one Flate stream of `megabytes` of ``q Q`` operators: a few KB."""
    raw = b"q Q\n" * int(megabytes * 1024 * 1024 / 4) + b"BT /F1 12 Tf 10 10 Td (x) Tj ET\n"
    stream = zlib.compress(raw, 9)
    kids = " ".join(f"{4 + i} 0 R" for i in range(pages))
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R /Resources "
        b"<< /Font << /F1 << /Type /Font /Subtype /Type1 /BaseFont /Helvetica >> >> >> >>"
    )
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        *([page] * pages),
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


async def test_a_pdf_is_read_as_before() -> None:
    text = await read_pdf(pdf(["The spec says ship on Friday", "page two"]), 1, 10_000)
    assert text.startswith("--- page 1 ---\nThe spec says ship on Friday")
    assert text.endswith("[only the first 1 of 2 pages were read]")


async def test_a_broken_pdf_is_named_by_its_error() -> None:
    with pytest.raises(PdfNotRead, match=r"PdfStreamError|PdfReadError"):
        await read_pdf(b"%PDF-1.4\nnot really", 10, 10_000)


async def test_a_pdf_built_to_be_slow_is_given_up_at_its_limit() -> None:
    bomb = slow_pdf()
    assert len(bomb) < 20_000
    began = time.monotonic()
    with pytest.raises(PdfNotRead, match="read too long"):
        await read_pdf(bomb, 50, 100_000, seconds=2)
    assert time.monotonic() - began < 5  # was minutes


async def test_a_read_cancelled_by_a_stop_leaves_no_process() -> None:
    read = asyncio.ensure_future(read_pdf(slow_pdf(), 50, 100_000, seconds=60))
    await asyncio.sleep(1)
    assert len(_readers()) == 1
    began = time.monotonic()
    read.cancel()
    with pytest.raises(asyncio.CancelledError):
        await read
    assert time.monotonic() - began < 2
    assert _readers() == []


def _readers() -> list[str]:
    """The PDF-reading processes alive now."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and b"gateway.file_text" in (proc / "cmdline").read_bytes():
                found.append(proc.name)
    return found
