"""Downloads a model's original files, each checked against its sha256.

A file is written to NAME.partial beside its place and renamed when its sha256 is right, so that a
models folder never holds a half-written or wrong file under a real name. An interrupted download
resumes where its .partial ends (an HTTP Range request, or a seek for file:// and plain paths);
a server that ignores the range sends the whole file, which then replaces the partial one. A
checksum that does not match removes the .partial and stops with an error naming the file, the URL
and both sums.
"""
import hashlib
import os
import urllib.error
import urllib.request

__all__ = ["FetchError", "fetch_file", "sha256_of"]

CHUNK = 1 << 20


class FetchError(Exception):
    pass


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _open(url, offset):
    """The stream of `url` from byte `offset`, and whether it starts there (False: from 0)."""
    if offset:
        request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"})
    else:
        request = urllib.request.Request(url)
    response = urllib.request.urlopen(request, timeout=60)
    if url.startswith("file:"):  # urllib's file handler ignores Range: seek instead
        response.seek(offset)
        return response, True
    return response, getattr(response, "status", 200) == 206


def _download(url, partial, offset, size, progress, destination):
    """Appends `url` from byte `offset` to `partial` (or rewrites it whole when the server sends
    the whole file); whether it resumed."""
    try:
        stream, ranged = _open(url, offset)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise FetchError(f"{url}: {getattr(e, 'reason', e)} (for {destination}; a .partial "
                         "download, if any, is kept: rerun to resume)") from None
    with stream, open(partial, "ab" if ranged and offset else "wb") as out:
        done = offset if ranged else 0
        while True:
            block = stream.read(CHUNK)
            if not block:
                break
            out.write(block)
            done += len(block)
            if progress:
                progress(done, size)
    return ranged and offset > 0


def fetch_file(url, destination, sha256, size=None, progress=None):
    """Downloads `url` to `destination` unless a file with the right sha256 is there already.
    Returns "present", "fetched" or "resumed"."""
    if os.path.exists(destination):
        got = sha256_of(destination)
        if got == sha256:
            return "present"
        raise FetchError(f"{destination}: sha256 {got}, expected {sha256} (a different file is "
                         "there: move it away, and rerun)")
    os.makedirs(os.path.dirname(destination) or ".", exist_ok=True)
    partial = destination + ".partial"
    offset = os.path.getsize(partial) if os.path.exists(partial) else 0
    if size is not None and offset > size:
        os.remove(partial)
        offset = 0
    ranged = bool(offset)
    if size is None or offset < size:  # a partial of the whole size is only checked
        ranged = _download(url, partial, offset, size, progress, destination)
    got = sha256_of(partial)
    if got != sha256:
        os.remove(partial)
        raise FetchError(f"{destination}: the file at {url} has sha256 {got}, expected {sha256}: "
                         "not the file this project was measured with, so nothing was kept")
    os.replace(partial, destination)
    return "resumed" if ranged and offset else "fetched"
