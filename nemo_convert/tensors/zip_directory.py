"""The central directory of a zip archive laid out exactly as ``torch.save`` writes it, read
with ``struct`` from memory (:func:`read_directory`) — a dist checkpoint has one archive per
chunk, tens of thousands of them, and :class:`zipfile.ZipFile` costs too much per archive.
Anything else is left to :mod:`zipfile` (the caller falls back when this returns None).

Layout facts: PKWARE APPNOTE 6.3.10, sections 4.3.7 (local header), 4.3.12 (central
directory entry), 4.3.14-4.3.16 (zip64 end records and the end of central directory).
"""

from __future__ import annotations

import bisect
import struct

LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, 22 bytes, name length, extra length
_EOCD = struct.Struct("<4sHHHHIIH")  # end of central directory, no zip64
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # one central directory entry, before its name
_ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")  # zip64 end of central directory record (no extensible data)
_ZIP64_LOCATOR = struct.Struct("<4sIQI")  # zip64 end of central directory locator


class ZipMember:
    """What a reader of the archive uses of one zip member: ``zipfile.ZipInfo``'s attribute names."""

    __slots__ = ("filename", "header_offset", "compress_type", "flag_bits", "compress_size", "file_size", "CRC",
                 "end")

    def __init__(self, filename: str, header_offset: int, compress_type: int, flag_bits: int, compress_size: int,
                 file_size: int, crc: int) -> None:
        self.filename, self.header_offset, self.compress_type, self.flag_bits = (filename, header_offset,
                                                                                 compress_type, flag_bits)
        self.compress_size, self.file_size, self.CRC = compress_size, file_size, crc
        self.end = 0  # where the next member (or the directory) starts: its bytes must end before


def read_directory(buf: memoryview) -> dict[str, ZipMember] | None:
    """The members of the zip archive that is exactly ``buf`` (in memory, e.g. a mapped
    dist-checkpoint chunk), read by ``struct`` instead of :class:`zipfile.ZipFile` — a
    dist checkpoint has one archive per chunk, tens of thousands of them. Only the plain
    layout ``torch.save`` writes: no archive comment, zip64 end records only in their plain
    form (no zip64 sizes in the entries), no prefix, ASCII names, each once, entries that
    do not overlap. None for anything else: :mod:`zipfile` reads (or refuses)
    it then."""
    n = len(buf)
    if n < _EOCD.size:
        return None
    end = n - _EOCD.size  # where the central directory must end
    sig, disk, cd_disk, _, count, cd_size, cd_offset, comment = _EOCD.unpack_from(buf, end)
    if sig != b"PK\x05\x06" or disk or cd_disk or comment:
        return None
    if end >= _ZIP64_LOCATOR.size + _ZIP64_EOCD.size and buf[end - _ZIP64_LOCATOR.size:][:4] == b"PK\x06\x07":
        # torch.save always writes the zip64 records (PKWARE APPNOTE 4.3.14, 4.3.15), and
        # their counts are the ones that hold; only the plain form: one disk, the record
        # just before its locator, no extensible data
        _, z_disk, z_at, z_disks = _ZIP64_LOCATOR.unpack_from(buf, end - _ZIP64_LOCATOR.size)
        end -= _ZIP64_LOCATOR.size + _ZIP64_EOCD.size
        (sig, rec_size, _, _, disk, cd_disk, _, count, cd_size,
         cd_offset) = _ZIP64_EOCD.unpack_from(buf, end)
        if (sig != b"PK\x06\x06" or z_disk or z_disks != 1 or z_at != end or rec_size != _ZIP64_EOCD.size - 12
                or disk or cd_disk):
            return None
    elif count == 0xFFFF or cd_offset == 0xFFFFFFFF:
        return None
    if cd_offset + cd_size != end:
        return None
    members: dict[str, ZipMember] = {}
    at = cd_offset
    for _ in range(count):
        if at + _CENTRAL.size > cd_offset + cd_size:
            return None
        (sig, _, _, flags, method, _, _, crc, csize, size, name_len, extra_len, comment_len, _, _, _,
         header) = _CENTRAL.unpack_from(buf, at)
        at += _CENTRAL.size
        if sig != b"PK\x01\x02" or 0xFFFFFFFF in (csize, size, header) or at + name_len > cd_offset + cd_size:
            return None
        raw = bytes(buf[at:at + name_len])
        if not raw.isascii():
            return None
        members[raw.decode("ascii")] = ZipMember(raw.decode("ascii"), header, method, flags, csize, size, crc)
        at += name_len + extra_len + comment_len
    if at != cd_offset + cd_size or len(members) != count:  # (a name twice: zipfile decides)
        return None
    ends = sorted(m.header_offset for m in members.values()) + [cd_offset]
    for m in members.values():
        m.end = ends[bisect.bisect_right(ends, m.header_offset)] if m.header_offset < cd_offset else -1
        if m.header_offset + LOCAL_HEADER.size + m.compress_size > m.end:
            return None
    return members


__all__ = ["LOCAL_HEADER", "ZipMember", "read_directory"]
