"""A file's text for the model: a PDF's read in a process of its own, bounded in time and memory.

pypdf's own limits apply per stream and page; a PDF of a few kilobytes whose pages share one
content stream just under them cost about 8 s of CPU a page, and its read held a worker slot
for minutes, every slot that took the session again, and the process past its stop (an
outside probe). So a PDF is read by ``python -m gateway.file_text`` (`read_pdf`): at most
`PDF_SECONDS` of wall time and CPU and `PDF_MEMORY_BYTES` of address space, killed past them;
the model is told the file could not be read in time (D351).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import resource
import sys

from gateway.errors import GatewayError

__all__ = ["PDF_MEMORY_BYTES", "PDF_SECONDS", "PdfNotRead", "cut", "pdf_text", "read_pdf"]

PDF_SECONDS = 20.0
"""The longest one PDF's read may take (wall time and CPU)."""

PDF_MEMORY_BYTES = 1 << 30
"""The address space the reading process may use."""


class PdfNotRead(GatewayError):
    """The PDF could not be read; the message names why (an error's class, or the limit)."""


def cut(text: str, limit: int, unit: str) -> str:
    """`text` cut to `limit`, saying so."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[cut: the first {limit:,} of {len(text):,} {unit} are shown]"


def pdf_text(data: bytes, max_pages: int, max_chars: int) -> str:
    """The text of a PDF's first pages (pypdf), bounded; says so where pages were left out."""
    from pypdf import PdfReader  # imported when a PDF arrives: most runs never need it

    reader = PdfReader(io.BytesIO(data))
    pages = reader.pages
    total = len(pages)
    read = min(total, max_pages)
    parts = []
    size = 0
    for number in range(read):
        text = pages[number].extract_text() or ""
        parts.append(f"--- page {number + 1} ---\n{text}")
        size += len(text)
        if size > max_chars:
            break  # what follows would be cut anyway
    body = cut("\n".join(parts), max_chars, "characters")
    if read < total:
        body += f"\n[only the first {read} of {total} pages were read]"
    return body


async def read_pdf(
    data: bytes,
    max_pages: int,
    max_chars: int,
    *,
    seconds: float = PDF_SECONDS,
    memory_bytes: int = PDF_MEMORY_BYTES,
) -> str:
    """`pdf_text` of `data` in a child process, within `seconds` and `memory_bytes`.

    Cancelling the call kills the child: a stop never waits for a read.

    Raises:
        PdfNotRead: the PDF is broken or encrypted (its error's class), or the read passed a
            limit (``read too long``, ``too large to read``).
    """
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.file_text",
        str(max_pages),
        str(max_chars),
        str(max(1, int(seconds))),
        str(memory_bytes),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(seconds):
            out, _ = await process.communicate(data)
    except TimeoutError:
        raise PdfNotRead(f"read too long: more than {seconds:g} s") from None
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    try:
        said = json.loads(out)
    except ValueError:
        # killed by a limit (CPU: SIGXCPU; memory: a MemoryError that could not be written)
        why = "read too long" if process.returncode == -24 else "too large to read"
        raise PdfNotRead(why) from None
    if "error" in said:
        raise PdfNotRead(str(said["error"]))
    return str(said["text"])


def main(argv: list[str]) -> None:
    """Read a PDF from stdin; write ``{"text"}`` or ``{"error"}`` as JSON to stdout."""
    max_pages, max_chars, seconds, memory = (int(a) for a in argv)
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    data = sys.stdin.buffer.read()
    try:
        said = {"text": pdf_text(data, max_pages, max_chars)}
    except MemoryError:
        said = {"error": "too large to read"}
    except Exception as exc:  # a broken or encrypted PDF: its error's class names it
        said = {"error": type(exc).__name__}
    sys.stdout.write(json.dumps(said))


if __name__ == "__main__":
    main(sys.argv[1:])
