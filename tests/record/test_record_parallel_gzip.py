"""Compressed records are compressed in chunks on several threads, optionally by ISA-L, and
stay standard gzip: Python's `gzip`, the `gunzip` command and earlier readers open them."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import zlib

import msgpack
import numpy as np
import pytest
import torch
from record_testing import assert_same, nested_state

import ember.record as er
from ember.errors import ConfigError
from ember.record import gz
from ember.record.problem import RecordProblem
from ember.record.reader import decode_record

COMPRESSORS = [
    "zlib",
    pytest.param(
        "isal",
        marks=pytest.mark.skipif(
            gz.deflate_module("auto") is zlib, reason="the optional isal package is not installed"
        ),
    ),
]


def weights(n: int, seed: int = 0) -> bytes:
    """Float16 weight-like bytes: compressible, but not trivially."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=generator) * 0.02).half().numpy().tobytes()


def reference_inflate(data: bytes) -> bytes:
    """An independent reader: zlib's own gzip decoding, one member after the other."""
    out, rest = [], data
    while rest:
        decompressor = zlib.decompressobj(31)
        out.append(decompressor.decompress(rest))
        assert decompressor.eof
        rest = decompressor.unused_data
    return b"".join(out)


@pytest.mark.parametrize("compressor", COMPRESSORS)
@pytest.mark.parametrize("size", [0, 1, gz.CHUNK_BYTES - 1, gz.CHUNK_BYTES, 5 * gz.CHUNK_BYTES + 7])
def test_chunked_gzip_is_one_standard_member_any_reader_opens(size, compressor):
    content = weights((size + 1) // 2)[:size]
    data = gz.gzip_bytes(content, threads=4, compressor=compressor)
    assert gzip.decompress(data) == content
    assert reference_inflate(data) == content
    assert gz.gunzip_bytes(data) == content
    assert gz.declared_size(data) == size
    # one member: the stream ends exactly at the end of the file
    decompressor = zlib.decompressobj(31)
    decompressor.decompress(data)
    assert decompressor.eof and decompressor.unused_data == b""


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_the_bytes_do_not_depend_on_the_thread_count(compressor):
    content = weights(3 * gz.CHUNK_BYTES)
    one = gz.gzip_bytes(content, threads=1, compressor=compressor)
    assert gz.gzip_bytes(content, threads=3, compressor=compressor) == one
    assert gz.gzip_bytes(content, threads=8, compressor=compressor) == one


@pytest.mark.skipif(shutil.which("gunzip") is None, reason="no gunzip command")
def test_the_gunzip_command_opens_a_compact_record(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(300, 400), torch.nn.Linear(400, 300))
    path = er.CompactRecorder().save(model, tmp_path / "model")
    done = subprocess.run(["gunzip", "-c", str(path)], capture_output=True, check=True)
    assert len(done.stdout) > gz.CHUNK_BYTES  # several chunks, compressed apart
    document = msgpack.unpackb(done.stdout, strict_map_key=False)
    assert document["format"] == "ember.mpk" and document["precision"] == "half"
    assert done.stdout == gzip.decompress(path.read_bytes())


def test_several_members_load_as_their_contents_joined(tmp_path):
    """A record split into members (as `cat a.gz b.gz` or a multi-member writer makes),
    each with ember's size field or without it, reads as the whole record."""
    path = er.CompactRecorder().save(nested_state(), tmp_path / "o")
    inner = gzip.decompress(path.read_bytes())
    cut = len(inner) // 3
    sized = gz.gzip_bytes(inner[:cut]) + gz.gzip_bytes(inner[cut:], compressor="zlib")
    assert gz.gunzip_bytes(sized) == inner
    joined = tmp_path / "joined.mpk.gz"
    joined.write_bytes(sized)
    assert_same(er.load(None, joined), er.load(None, path))
    # members written by the gzip module (no size field); the last is the largest
    plain = gzip.compress(inner[:cut], mtime=0) + gzip.compress(inner[cut:], mtime=0)
    assert_same(decode_record(plain).tree, nested_state())


def test_a_member_damaged_after_the_first_is_refused(tmp_path):
    first, second = weights(5000), weights(5000, seed=1)
    data = bytearray(gz.gzip_bytes(first) + gz.gzip_bytes(second))
    data[-12] ^= 0x40  # in the second member's deflate data or CRC
    with pytest.raises(RecordProblem, match="damaged"):
        gz.gunzip_bytes(bytes(data))
    with pytest.raises(RecordProblem, match="after the end"):
        gz.gunzip_bytes(gz.gzip_bytes(first) + b"trailing")


def test_an_unknown_compressor_or_thread_count_is_refused():
    with pytest.raises(ConfigError, match="unknown compressor 'lz4'"):
        gz.gzip_bytes(b"abc", compressor="lz4")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="threads must be at least 1"):
        gz.gzip_bytes(weights(gz.CHUNK_BYTES), threads=0)


def test_compact_records_are_small_in_half_and_bf16(tmp_path):
    """Weights shaped like a trained network's (normal, small): float16 records stay
    under 0.45x the float32 bytes, bfloat16 ones under 0.36x (rotated bits)."""
    generator = torch.Generator().manual_seed(0)
    state = {f"w{i}": torch.randn(512, 512, generator=generator) * 0.05 for i in range(4)}
    f32 = sum(t.numel() * 4 for t in state.values())
    model = torch.nn.Module()
    for name, value in state.items():
        model.register_buffer(name, value)
    for precision, bound in (("half", 0.45), ("bf16", 0.36)):
        path = er.CompactRecorder(precision).save(model, tmp_path / precision)
        assert path.stat().st_size / f32 < bound, precision
        loaded = er.load(None, path)
        dtype = er.Precision(precision).dtype
        for name, value in state.items():
            assert torch.equal(loaded[name], value.to(dtype)), name


def test_bf16_records_rotate_their_bits_and_say_so(tmp_path):
    tensor = torch.tensor([1.0, -2.0, 0.5, -0.0], dtype=torch.bfloat16)
    path = er.CompactRecorder("bf16").save({"w": tensor}, tmp_path / "s", kind="module")
    document = msgpack.unpackb(gzip.decompress(path.read_bytes()), strict_map_key=False)
    assert document["version"] == 2
    node = document["record"]["w"]["$tensor"]
    assert node["rotate"] == 1 and node["shuffle"] is True
    bits = tensor.view(torch.int16).numpy().view(np.uint16)
    rotated = ((bits << 1) | (bits >> 15)).astype("<u2").view(np.uint8).reshape(-1, 2)
    assert node["data"] == rotated.T.tobytes()  # rotated, then grouped by byte
    assert torch.equal(er.load(None, path)["w"], tensor)
    plain = er.DefaultRecorder("bf16").save({"w": tensor}, tmp_path / "p", kind="module")
    assert msgpack.unpackb(plain.read_bytes(), strict_map_key=False)["version"] == 1
