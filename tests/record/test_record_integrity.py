"""Every byte of every record is checked: edited hyperparameters, rewritten headers, gzip
bombs and downgraded versions are refused; records from before whole-file checksums load."""

from __future__ import annotations

import base64
import gzip
import json
import re
import struct
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
import torch
from record_testing import RECORDERS, assert_same, checkpoint_state

import ember.record as er
from ember.errors import RecordError
from ember.record import checksum
from ember.record.gz import gunzip_bytes, gzip_bytes

LEGACY = Path(__file__).parent / "legacy"
GZIPPED = [cls for cls in RECORDERS if cls.compressed]


def adam() -> torch.optim.Adam:
    """An Adam optimizer after one step: lr 0.01, betas (0.9, 0.999)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.9, 0.999))
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return optimizer


def stored(value: float, binary: bool) -> bytes:
    """How a float of the tree appears in a file: msgpack float64 or JSON text."""
    return b"\xcb" + struct.pack(">d", value) if binary else repr(value).encode()


def refused(cls: type, path: Path, match: str = "checksum") -> None:
    for attempt in (lambda: cls().load(None, path), lambda: er.load(None, path)):
        with pytest.raises(RecordError, match=match) as info:
            attempt()
        assert str(path) in str(info.value)


def edit_content(cls: type, path: Path, old: bytes, new: bytes) -> None:
    """Replace the one occurrence of `old` in the record's content (gzipped again if it was)."""
    data = path.read_bytes()
    content = gzip.decompress(data) if cls.compressed else data
    assert content.count(old) == 1, (old, content.count(old))
    content = content.replace(old, new)
    path.write_bytes(gzip_bytes(content) if cls.compressed else content)


@pytest.mark.parametrize("old, new", [(0.01, 0.91), (0.999, 0.969)], ids=["lr", "beta2"])
@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_one_edited_hyperparameter_digit_is_refused(cls, tmp_path, old, new):
    optimizer = adam()
    path = cls().save(optimizer, tmp_path / "optim")
    assert_same(er.load(None, path), optimizer.state_dict())
    binary = cls.format.name in ("ember.mpk", "ember.bin")
    edit_content(cls, path, stored(old, binary), stored(new, binary))
    refused(cls, path)
    target = torch.optim.Adam(torch.nn.Linear(3, 2).parameters(), lr=0.5)
    with pytest.raises(RecordError, match="checksum"):
        er.load(target, path)
    assert target.param_groups[0]["lr"] == 0.5


@pytest.mark.parametrize(
    "old, new",
    [
        (rb"\"step\":{\"$tensor\"", rb"\"stEp\":{\"$tensor\""),  # a key of the tree
        (rb"\"precision\":\"full\"", rb"\"precision\":\"half\""),  # the header
        (b'"shape":[2,3]', b'"shape":[3,2]'),  # the safetensors table
    ],
    ids=["tree-key", "precision", "shape"],
)
def test_edits_in_the_safetensors_header_are_refused(tmp_path, old, new):
    path = er.SafetensorsFileRecorder().save(adam(), tmp_path / "optim")
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new, 1))
    refused(er.SafetensorsFileRecorder, path)


def test_a_rewritten_safetensors_header_is_refused(tmp_path):
    """A tool that swaps two moments' data offsets and rewrites the header is caught."""
    path = er.SafetensorsFileRecorder().save(adam(), tmp_path / "optim")
    data = path.read_bytes()
    (size,) = struct.unpack_from("<Q", data)
    table = json.loads(data[8 : 8 + size])
    first, second = table["state.0.exp_avg"], table["state.0.exp_avg_sq"]
    first["data_offsets"], second["data_offsets"] = second["data_offsets"], first["data_offsets"]
    header = json.dumps(table, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data[8 + size :])
    refused(er.SafetensorsFileRecorder, path)


@pytest.mark.parametrize(
    "cls", [cls for cls in RECORDERS if not cls.compressed], ids=lambda c: c.file_extension
)
def test_an_edited_tensor_byte_is_refused(cls, tmp_path):
    path = cls().save({"w": torch.tensor([1.0, 2.0, 3.0])}, tmp_path / "w")
    raw, edited = struct.pack("<3f", 1.0, 2.0, 3.0), struct.pack("<3f", 1.0, 2.0, 3.5)
    if cls.format.name == "ember.json":
        raw, edited = base64.b64encode(raw), base64.b64encode(edited)
    edit_content(cls, path, raw, edited)
    refused(cls, path)


@pytest.mark.parametrize("cls", [er.PrettyJsonFileRecorder, er.JsonGzFileRecorder])
def test_reformatted_json_is_refused(cls, tmp_path):
    """Whitespace is covered too: the file must be byte for byte what was written."""
    path = cls().save({"lr": 0.01}, tmp_path / "s")
    data = path.read_bytes()
    text = (gzip.decompress(data) if cls.compressed else data).decode()
    document = json.loads(text)
    again = json.dumps(document, indent=4).encode()
    path.write_bytes(gzip_bytes(again) if cls.compressed else again)
    refused(cls, path)


@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_records_from_before_whole_file_checksums_still_load(cls):
    """Files written by ember 0.1.0 before this change: JSON and safetensors format version 1
    (tensor checksums only) and gzip without the size field."""
    path = LEGACY / f"state.{cls.file_extension}"
    assert_same(cls().load(None, path), checkpoint_state())
    assert_same(er.load(None, path), checkpoint_state())


@pytest.mark.parametrize("cls", [er.PrettyJsonFileRecorder, er.JsonGzFileRecorder])
def test_a_json_record_relabelled_version_1_is_refused(cls, tmp_path):
    """Version 1 files had no whole-file checksum; a newer file may not pass as one."""
    path = cls().save(adam(), tmp_path / "optim")
    data = path.read_bytes()
    text = bytearray(gzip.decompress(data) if cls.compressed else data)
    text[:] = re.sub(rb'"version": ?2', lambda m: m.group(0)[:-1] + b"1", bytes(text), count=1)
    checksum.seal(text, len(text) - (12 if text.endswith(b"\n") else 10))
    path.write_bytes(gzip_bytes(text) if cls.compressed else bytes(text))
    refused(cls, path, match="version 1 but does not have its layout")


def test_a_safetensors_record_relabelled_version_1_is_refused(tmp_path):
    path = er.SafetensorsFileRecorder().save(adam(), tmp_path / "optim")
    data = bytearray(path.read_bytes().replace(rb"\"version\":2", rb"\"version\":1"))
    at = data.index(b'"ember_crc32":"') + len(b'"ember_crc32":"')
    checksum.seal(data, at)
    path.write_bytes(bytes(data))
    refused(er.SafetensorsFileRecorder, path, match="version 1 but does not have its layout")


@pytest.mark.parametrize(
    "keys", [[b'"ember":'], [b'"ember":', b'"ember_crc32":']], ids=["ember", "both"]
)
def test_a_damaged_ember_safetensors_record_is_not_taken_for_a_foreign_file(tmp_path, keys):
    """Files from other tools load as flat dicts; an ember file that lost its keys does not."""
    path = er.SafetensorsFileRecorder().save(adam(), tmp_path / "optim")
    data = path.read_bytes()
    for key in keys:
        data = data.replace(key, key.replace(b"ember", b"emBer"))
    path.write_bytes(data)
    refused(er.SafetensorsFileRecorder, path, match="checksum|ember metadata is missing")


def test_gzipped_records_declare_their_size(tmp_path):
    for cls in GZIPPED:
        path = cls().save(adam(), tmp_path / "optim")
        data = path.read_bytes()
        assert data[3] == 0x04 and data[12:16] == b"EM\x08\x00"
        (size,) = struct.unpack_from("<Q", data, 16)
        assert size == len(gzip.decompress(data))


# Gzip bombs: a small file whose content inflates far past what it declares.
BOMB_CONTENT = 256 * 2**20  # zeros: deflate shrinks them about 1000 times
DECLARED = 2**20


@pytest.fixture(scope="module")
def zeros_deflated() -> tuple[bytes, int]:
    """Raw deflate data of BOMB_CONTENT zero bytes, and their CRC-32."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = bytes(2**20)
    parts, crc = [], 0
    for _ in range(BOMB_CONTENT // len(chunk)):
        parts.append(compressor.compress(chunk))
        crc = zlib.crc32(chunk, crc)
    parts.append(compressor.flush())
    return b"".join(parts), crc


def ember_gzip(body: bytes, crc: int, declared: int, field: bytes = b"EM") -> bytes:
    header = b"\x1f\x8b\x08\x04\x00\x00\x00\x00\x04\xff\x0c\x00" + field + b"\x08\x00"
    trailer = struct.pack("<II", crc, BOMB_CONTENT & 0xFFFFFFFF)
    return header + struct.pack("<Q", declared) + body + trailer


def plain_gzip(body: bytes, crc: int, trailer_size: int) -> bytes:
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03"
    return header + body + struct.pack("<II", crc, trailer_size)


BOMBS = {
    "lying-size": (lambda body, crc: ember_gzip(body, crc, DECLARED), "inflates past"),
    "lying-trailer": (lambda body, crc: plain_gzip(body, crc, DECLARED), "inflates past"),
    "absurd-size": (lambda body, crc: ember_gzip(body, crc, 2**62), "more than"),
    "no-size-field": (lambda body, crc: ember_gzip(body, crc, DECLARED, b"XY"), "gzip header"),
}


def headed(cls: type, tmp_path: Path, zeros: tuple[bytes, int]) -> tuple[bytes, int]:
    """Raw deflate data of a genuine record's content followed by the zeros, and its
    CRC-32: a bomb whose first bytes read as a record of `cls`."""
    content = gzip.decompress(cls().save(adam(), tmp_path / "genuine").read_bytes())
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = compressor.compress(content) + compressor.flush(zlib.Z_SYNC_FLUSH)
    crc, chunk = zlib.crc32(content), bytes(2**20)
    for _ in range(BOMB_CONTENT // len(chunk)):
        crc = zlib.crc32(chunk, crc)
    return head + zeros[0], crc


@pytest.mark.parametrize("bomb", sorted(BOMBS))
@pytest.mark.parametrize("cls", GZIPPED, ids=lambda c: c.file_extension)
def test_gzip_bombs_are_refused_quickly_with_bounded_memory(cls, tmp_path, zeros_deflated, bomb):
    make, match = BOMBS[bomb]
    data = make(*headed(cls, tmp_path, zeros_deflated))
    assert len(data) < BOMB_CONTENT / 500
    path = tmp_path / f"bomb.{cls.file_extension}"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        start = time.perf_counter()
        refused(cls, path, match=match)
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * DECLARED + 4 * len(data), peak
    assert elapsed < 5.0


HONEST = 512 * 2**20  # zeros that a small gzip file declares, truthfully


@pytest.mark.parametrize("cls", GZIPPED, ids=lambda c: c.file_extension)
def test_a_small_gzip_file_declaring_a_huge_content_that_is_no_record_is_refused_after_its_head(
    cls, tmp_path
):
    """A 0.5 MB file whose header truthfully declares 512 MB of zeros: refused as no
    record once its first 64 KiB are inflated, holding a few hundred KiB at most."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk, parts, crc = bytes(2**20), [], 0
    for _ in range(HONEST // len(chunk)):
        parts.append(compressor.compress(chunk))
        crc = zlib.crc32(chunk, crc)
    parts.append(compressor.flush())
    header = b"\x1f\x8b\x08\x04\x00\x00\x00\x00\x04\xff\x0c\x00EM\x08\x00"
    data = header + struct.pack("<Q", HONEST) + b"".join(parts) + struct.pack("<II", crc, 0)
    assert len(data) < HONEST / 500
    path = tmp_path / f"zeros.{cls.file_extension}"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        refused(cls, path, match="not an ember")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(data) + 2**20, peak  # the file read once, the head inflated


def test_gzip_content_is_inflated_into_one_buffer_of_the_declared_size(tmp_path):
    """A genuine record inflates into one buffer: its content is held once, never twice."""
    weights = {"w": torch.arange(4 * 2**20, dtype=torch.uint8)}  # 4 MiB of content
    data = er.CompactRecorder().save(weights, tmp_path / "big").read_bytes()
    (size,) = struct.unpack_from("<Q", data, 16)
    tracemalloc.start()
    try:
        content = gunzip_bytes(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert content == gzip.decompress(data) and len(content) == size
    assert peak < size + 2**20, (peak, size)  # the content, and one piece being inflated


def test_gzip_content_shorter_than_declared_is_refused(tmp_path):
    path = er.CompactRecorder().save(adam(), tmp_path / "optim")
    data = bytearray(path.read_bytes())
    (size,) = struct.unpack_from("<Q", data, 16)
    struct.pack_into("<Q", data, 16, size + 1)
    path.write_bytes(bytes(data))
    refused(er.CompactRecorder, path, match="not the")
