"""The one policy every channel's files go through (`adapters.files.take_in`, `file_kind`)."""

from __future__ import annotations

import pytest

from adapters import FileLimits, file_kind, image_format, image_refusal, take_in
from adapters.channel import Attachment, FileRefused, IncomingFile, Unavailable
from tests.support.file_samples import image, png

LIMITS = FileLimits(max_file_bytes=100, max_files=2, max_message_bytes=150)


class Area:
    """Blobs in memory, counting fetches."""

    def __init__(self) -> None:
        self.held: dict[str, bytes] = {}
        self.fetches: list[str] = []

    async def find(self, key: str) -> tuple[str, int] | None:
        data = self.held.get(key)
        return None if data is None else (f"b:{key}", len(data))

    async def put(self, key: str, data: bytes) -> str:
        self.held[key] = data
        return f"b:{key}"

    def file(
        self, name: str, data: bytes, media_type: str = "text/plain", **kw: int
    ) -> IncomingFile:
        async def fetch(limit: int) -> bytes:
            self.fetches.append(name)
            return data

        size = kw.get("declared", len(data))
        return IncomingFile(Attachment(name=name, media_type=media_type, size=size), name, fetch)

    async def take(self, *files: IncomingFile) -> tuple[Attachment, ...]:
        return await take_in(files, LIMITS, find=self.find, put=self.put)


@pytest.mark.parametrize(
    ("name", "media_type", "kind"),
    [
        ("shot.png", "image/png", "image"),
        ("photo.JPG", "application/octet-stream", "image"),
        ("shot.svg", "image/svg+xml", "text"),  # an SVG is XML text, not an image a model takes
        ("report.pdf", "application/octet-stream", "pdf"),
        ("data.csv", "text/csv", "text"),
        ("events.json", "application/json", "text"),
        ("main.rs", "application/octet-stream", "text"),
        ("Dockerfile", "", "text"),
        ("build.log", "application/octet-stream", "text"),
        ("archive.zip", "application/zip", None),
        ("movie.mp4", "video/mp4", None),
    ],
)
def test_kinds(name: str, media_type: str, kind: str | None) -> None:
    assert file_kind(name, media_type) == kind


async def test_count_size_and_total_are_refused_before_any_fetch() -> None:
    area = Area()
    taken = await area.take(
        area.file("a.txt", b"a" * 60),
        area.file("huge.txt", b"", declared=101),  # its declared size alone refuses it
        area.file("b.txt", b"b" * 60),
        area.file("c.txt", b"c"),  # a third file: over the count
        area.file("x.zip", b"PK", "application/zip"),
    )
    assert [a.blob for a in taken] == ["b:a.txt", None, "b:b.txt", None, None]
    assert taken[1].refused == "it is 101 bytes, over the 100 bytes limit for one file"
    assert taken[3].refused == "I read only the first 2 files of a message"
    assert (taken[4].refused or "").startswith("I do not read application/zip files")
    assert area.fetches == ["a.txt", "b.txt"]
    total = await Area().take(Area().file("a.txt", b"a" * 100), Area().file("b.txt", b"b" * 60))
    assert total[1].refused is not None and "together" in total[1].refused


@pytest.mark.parametrize(
    ("name", "media_type"),
    [
        ("smime.p7m", "application/pkcs7-mime"),
        ("smime.p7m", "application/x-pkcs7-mime"),
        ("version.asc", "application/pgp-encrypted"),
    ],
)
async def test_an_encrypted_file_is_refused_saying_so(name: str, media_type: str) -> None:
    """An encrypted mail's one file read "I do not read application/pkcs7-mime files": its
    sender learnt nothing they could act on (an outside probe)."""
    area = Area()
    [taken] = await area.take(area.file(name, b"MIAGCSqGSIb3DQEHA6CA", media_type))
    assert taken.blob is None
    assert (
        taken.refused == "it is encrypted, and I hold no key to read it (send it again unencrypted)"
    )


async def test_a_file_held_under_its_key_is_not_fetched_again() -> None:
    area = Area()
    first = await area.take(area.file("a.txt", b"hello"))
    again = await area.take(area.file("a.txt", b"hello"))
    assert first == again
    assert area.fetches == ["a.txt"]


async def test_a_content_larger_than_declared_is_refused_and_not_held() -> None:
    area = Area()
    [taken] = await area.take(area.file("liar.txt", b"x" * 101, declared=10))
    assert taken.refused is not None and taken.blob is None
    assert area.held == {}


async def test_a_fetch_that_can_never_succeed_refuses_one_that_may_makes_it_unavailable() -> None:
    area = Area()

    async def gone(limit: int) -> bytes:
        raise FileRefused("Slack did not hand it over (HTTP 404)")

    async def down(limit: int) -> bytes:
        raise ConnectionError("reset")

    meta = Attachment(name="a.txt", media_type="text/plain", size=3)
    [taken] = await take_in([IncomingFile(meta, "k1", gone)], LIMITS, find=area.find, put=area.put)
    assert taken.refused == "Slack did not hand it over (HTTP 404)"
    with pytest.raises(Unavailable, match="could not be taken in"):
        await take_in([IncomingFile(meta, "k2", down)], LIMITS, find=area.find, put=area.put)
    assert area.held == {}


@pytest.mark.parametrize(
    ("extension", "media_type"),
    [("png", "image/png"), ("jpg", "image/jpeg"), ("gif", "image/gif"), ("webp", "image/webp")],
)
def test_an_image_is_known_by_its_bytes_and_a_real_one_is_taken(
    extension: str, media_type: str
) -> None:
    data = image(extension)
    assert image_format(data) == media_type
    assert image_refusal(data, FileLimits()) is None


def test_an_image_a_model_would_refuse_says_why() -> None:
    limits = FileLimits(max_image_bytes=2_000, max_image_side=100)
    # what each would have failed, at the provider, in this request and every later one
    assert image_refusal(b"GIF8 not an image at all", limits) == (
        "it is not a PNG, JPEG, GIF or WebP image"
    )
    assert image_refusal(b"BM" + b"\0" * 60, limits) == (  # a BMP: no provider reads it
        "it is not a PNG, JPEG, GIF or WebP image"
    )
    assert image_refusal(image("jpg")[:4], limits) == (
        "its size in pixels cannot be read (a damaged image)"
    )
    assert image_refusal(png(101, 1), limits) == (
        "it is 101x1 pixels, over the 100 a model takes on a side"
    )
    assert image_refusal(png(1, 1) + b"\0" * 2_000, limits) == (
        "it is 2.1 KB, over the 2.0 KB a model takes for an image"
    )
    # just over the default limit: the figures carry the decimals that tell them apart
    assert image_refusal(png(1, 1) + b"\0" * 3_760_000, FileLimits()) == (
        "it is 3.76 MB, over the 3.75 MB a model takes for an image"
    )
    assert image_refusal(png(1, 1) + b"\0" * 3_750_000, FileLimits()) == (
        "it is 3,750,069 bytes, over the 3,750,000 bytes a model takes for an image"
    )


async def test_an_image_a_model_would_refuse_is_refused_on_the_way_in_and_not_held() -> None:
    area = Area()
    limits = FileLimits(max_image_side=100)

    async def take(*files: IncomingFile) -> tuple[Attachment, ...]:
        return await take_in(files, limits, find=area.find, put=area.put)

    jpeg = image("jpg")
    taken = await take(
        area.file("photo.png", jpeg, "image/png"),  # mislabelled: taken, told as a JPEG later
        area.file("chart.png", b"<html>a login page</html>", "image/png"),
        area.file("wide.png", png(200, 1), "image/png"),
    )
    assert [a.blob for a in taken] == ["b:photo.png", None, None]
    assert taken[1].refused == "it is not a PNG, JPEG, GIF or WebP image"
    assert taken[2].refused == "it is 200x1 pixels, over the 100 a model takes on a side"
    assert area.held == {"photo.png": jpeg}
