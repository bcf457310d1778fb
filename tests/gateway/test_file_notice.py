"""The thread's notice of files it sent that were not read."""

from __future__ import annotations

from adapters.channel import Attachment
from gateway.files import file_notice_text


def _refused(name: str, why: str) -> Attachment:
    return Attachment(name=name, media_type="text/plain", size=10, refused=why)


def test_one_reason_is_said_once_for_every_file_it_refused() -> None:
    """Thirty files in one message: "I read only the first 10 files of a message" was said
    twenty times, and the notice cut short (an outside probe)."""
    many = "I read only the first 10 files of a message"
    refused = [
        _refused("tool.exe", "I do not read application/octet-stream files"),
        *(_refused(f"f{n}.txt", many) for n in range(10, 13)),
    ]
    assert file_notice_text(refused) == (
        "I could not read these files: tool.exe: I do not read application/octet-stream files; "
        "f10.txt, f11.txt, f12.txt: I read only the first 10 files of a message."
    )
    assert file_notice_text(refused[:1]) == (
        "I could not read the file tool.exe: I do not read application/octet-stream files."
    )
