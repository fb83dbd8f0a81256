"""Finding bad image files before training: non-images and truncated images.

`check_image_file` reads only a file's first and last bytes, so checking a
whole folder costs a directory walk, not a decoding pass. `drop_bad_files`
applies ``on_bad_example``: 'fail' raises on the first bad file, 'skip' leaves
them out and names them all in one log line.

Example:

    from tfaccel.data.bad_files import check_image_file

    check_image_file("cats/0001.jpg")   # None, or e.g. 'truncated JPEG (no end-of-image marker)'
"""

import logging
import os

import numpy as np

from tfaccel.errors import DataError

log = logging.getLogger("tfaccel")


def check_image_file(path):
    """Why `path` cannot be a whole image, or None when it looks complete.

    Reads only the first and last bytes: the format's signature and its end
    marker (JPEG's EOI, PNG's IEND, GIF's trailer, BMP's declared size), which
    catches non-image files and truncated images without decoding anything.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(32)
            f.seek(max(0, size - 1024))
            tail = f.read()
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if head[:3] == b"\xff\xd8\xff":
        return None if b"\xff\xd9" in tail else "truncated JPEG (no end-of-image marker)"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return None if b"IEND" in tail else "truncated PNG (no IEND chunk)"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return None if tail.rstrip(b"\x00").endswith(b";") else "truncated GIF (no trailer)"
    if head[:2] == b"BM" and len(head) >= 6:
        declared = int.from_bytes(head[2:6], "little")
        return None if size >= declared else f"truncated BMP ({size} of {declared} bytes)"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return None if size >= int.from_bytes(head[4:8], "little") + 8 else "truncated WebP"
    return "not an image (no JPEG, PNG, GIF, BMP or WebP signature)"


def drop_bad_files(files, labels, on_bad_example, what="image"):
    """Checks every file; 'fail' raises on the first bad one, 'skip' drops and names them."""
    if on_bad_example not in ("skip", "fail"):
        raise DataError(f"on_bad_example={on_bad_example!r}: use skip or fail")
    bad = [(f, why) for f in files if (why := check_image_file(f)) is not None]
    if bad and on_bad_example == "fail":
        hidden = (", or hide it (names starting with '.' are ignored)"
                  if what == "image" else "")
        raise DataError(f"bad {what} file {bad[0][0]}: {bad[0][1]}; remove it{hidden}, or pass "
                        f"--on_bad_example=skip to leave such files out ({len(bad)} bad file(s) "
                        "in all)")
    if bad:
        log.warning("skipping %d bad %s file(s): %s", len(bad), what,
                    "; ".join(f"{f} ({why})" for f, why in bad))
        bad_names = {f for f, _ in bad}
        keep = np.asarray([f not in bad_names for f in files])
        files, labels = list(np.asarray(files)[keep]), np.asarray(labels)[keep]
    return files, labels, tuple(bad)
