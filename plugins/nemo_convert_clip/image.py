"""Images for the CLIP zero-shot check, with or without Pillow.

With Pillow installed, any format it reads works and the transform is exactly OpenAI's
(PIL bicubic resize). Without it, a built-in reader handles PNG (8/16-bit, gray, RGB,
palette, with or without alpha, not interlaced) and binary PPM/PGM (P6/P5), and the
resize is torch's bicubic with antialiasing (the kernel PIL uses; values agree with
PIL to within rounding).
"""

from __future__ import annotations

import struct
import zlib

import torch

from nemo_convert.errors import InputError, UnsupportedError

#: OpenAI CLIP normalisation (NeMo's ``OPENAI_DATASET_MEAN`` / ``_STD``).
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


def have_pil() -> bool:
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    return True


# -- built-in readers ------------------------------------------------------------------------


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(raw: bytes, height: int, stride: int, bpp: int) -> bytearray:
    out = bytearray(height * stride)
    prev = bytearray(stride)
    pos = 0
    for y in range(height):
        ftype = raw[pos]
        line = bytearray(raw[pos + 1:pos + 1 + stride])
        pos += 1 + stride
        if len(line) != stride:
            raise InputError("PNG image data is truncated")
        if ftype == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:
            line = bytearray((x + p) & 0xFF for x, p in zip(line, prev))
        elif ftype == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                up_left = prev[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + _paeth(left, prev[i], up_left)) & 0xFF
        elif ftype != 0:
            raise InputError(f"PNG uses unknown filter type {ftype}")
        out[y * stride:(y + 1) * stride] = line
        prev = line
    return out


def read_png(data: bytes) -> torch.Tensor:
    """Decode a PNG into a ``[H, W, 3]`` uint8 RGB tensor (alpha dropped)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise InputError("not a PNG file")
    pos, idat, palette = 8, [], b""
    width = height = depth = ctype = interlace = -1
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"PLTE":
            palette = body
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if width <= 0 or height <= 0:
        raise InputError("PNG has no valid IHDR")
    if interlace:
        raise UnsupportedError("interlaced PNG needs Pillow (pip install pillow)")
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(ctype)
    if channels is None or depth not in ((8, 16) if ctype != 3 else (8,)):
        raise UnsupportedError(f"PNG colour type {ctype} at {depth} bits needs Pillow (pip install pillow)")
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as exc:
        raise InputError(f"PNG image data is corrupt: {exc}") from None
    bps = depth // 8
    stride, bpp = width * channels * bps, channels * bps
    pix = torch.frombuffer(_unfilter(raw, height, stride, bpp), dtype=torch.uint8)
    pix = pix.reshape(height, width, channels, bps)[..., 0]  # 16-bit: keep the high byte
    if ctype == 3:
        pal = torch.frombuffer(bytearray(palette), dtype=torch.uint8).reshape(-1, 3)
        return pal[pix[..., 0].long()]
    if channels in (1, 2):
        return pix[..., :1].expand(height, width, 3).contiguous()
    return pix[..., :3].contiguous()


def read_pnm(data: bytes) -> torch.Tensor:
    """Decode a binary PPM (P6) or PGM (P5) into a ``[H, W, 3]`` uint8 tensor."""
    magic = data[:2]
    if magic not in (b"P6", b"P5"):
        raise InputError("not a binary PPM/PGM file")
    fields: list[int] = []
    pos = 2
    while len(fields) < 3:
        while pos < len(data) and data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            while pos < len(data) and data[pos:pos + 1] not in (b"\n", b"\r"):
                pos += 1
            continue
        start = pos
        while pos < len(data) and data[pos:pos + 1].isdigit():
            pos += 1
        if start == pos:
            raise InputError("PPM header is corrupt")
        fields.append(int(data[start:pos]))
    pos += 1  # the single whitespace after maxval
    width, height, maxval = fields
    channels = 3 if magic == b"P6" else 1
    bps = 1 if maxval < 256 else 2
    need = width * height * channels * bps
    if len(data) - pos < need:
        raise InputError("PPM image data is truncated")
    pix = torch.frombuffer(bytearray(data[pos:pos + need]), dtype=torch.uint8).reshape(height, width, channels, bps)
    pix = pix[..., 0]
    if maxval not in (255, 65535):
        pix = (pix.float() * (255.0 / (maxval if bps == 1 else maxval / 256))).round().clamp(0, 255).to(torch.uint8)
    return pix.expand(height, width, 3).contiguous() if channels == 1 else pix.contiguous()


def read_image(path: str) -> tuple[torch.Tensor, str]:
    """``[H, W, 3]`` uint8 RGB pixels of ``path`` and which reader decoded it."""
    if have_pil():
        from PIL import Image

        try:
            with Image.open(path) as im:
                rgb = im.convert("RGB")
                data = bytearray(rgb.tobytes())
                return torch.frombuffer(data, dtype=torch.uint8).reshape(rgb.height, rgb.width, 3), "PIL"
        except OSError as exc:
            raise InputError(f"{path}: cannot read the image ({exc})") from None
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if raw[:8] == b"\x89PNG\r\n\x1a\n":
        return read_png(raw), "builtin"
    if raw[:2] in (b"P6", b"P5"):
        return read_pnm(raw), "builtin"
    raise UnsupportedError(f"{path}: without Pillow only PNG and binary PPM/PGM images are read "
                           "(pip install pillow for other formats)")


# -- OpenAI CLIP transform ---------------------------------------------------------------------


def _resized_size(h: int, w: int, size: int) -> tuple[int, int]:
    """torchvision ``Resize(size)``: the shorter side becomes ``size``."""
    if h <= w:
        return size, int(size * w / h)
    return int(size * h / w), size


def clip_preprocess(path: str, size: int) -> tuple[torch.Tensor, str]:
    """OpenAI CLIP's transform: resize the shorter side to ``size`` (bicubic), center
    crop ``size``×``size``, scale to [0, 1], normalise with the OpenAI mean and std.
    Returns a ``[1, 3, size, size]`` float32 tensor and the reader used."""
    pixels, reader = read_image(path)
    h, w = pixels.shape[:2]
    nh, nw = _resized_size(h, w, size)
    if reader == "PIL":
        from PIL import Image

        im = Image.fromarray(pixels.numpy(), "RGB").resize((nw, nh), Image.BICUBIC)
        img = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8).reshape(nh, nw, 3)
    else:
        x = pixels.permute(2, 0, 1).unsqueeze(0).float()
        if (nh, nw) != (h, w):
            x = torch.nn.functional.interpolate(x, size=(nh, nw), mode="bicubic", align_corners=False,
                                                antialias=True)
        img = x.round().clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    img = img[top:top + size, left:left + size]
    x = img.permute(2, 0, 1).float() / 255.0
    mean = torch.tensor(OPENAI_MEAN).view(3, 1, 1)
    std = torch.tensor(OPENAI_STD).view(3, 1, 1)
    return ((x - mean) / std).unsqueeze(0), reader
