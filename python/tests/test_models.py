"""python -m kvsim.models: fetch from the original publications (here a file:// mirror of the
shared models folder: the machines that run the suite are offline), convert to the layouts kvsim
reads, verify. Checked: the converted files equal the shared copies (byte for byte; the reference
outputs, a float32 run, within their printed rounding); a wrong checksum stops with the file named
and nothing kept under its name; a partial download resumes, a corrupt one restarts; convert
without the originals and verify of a wrong file fail, named. Skipped (77) without the models."""
import functools
import http.server
import io
import os
import shutil
import tempfile
import threading
import unittest
from contextlib import redirect_stderr, redirect_stdout

from kvsim.models import MODELS
from kvsim.models.__main__ import main
from kvsim.models.fetch import FetchError, fetch_file, sha256_of
from real_models import MODELS as SHARED, main_or_skip


def run(*args):
    """main()'s exit code and what it printed (stdout + stderr)."""
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = main(list(args))
    return code, out.getvalue()


def mirror_url(directory):
    return "file://" + os.path.abspath(directory)


def original(name, path):
    return next(f for f in MODELS[name] if f.path == path)


class FetchConvertVerify(unittest.TestCase):
    def test_fetch_convert_and_verify_reproduce_the_shared_models(self):
        models = tempfile.mkdtemp()
        code, said = run("fetch", "--models", models, "--mirror", mirror_url(SHARED))
        self.assertEqual(code, 0, said)
        self.assertIn("stories260K/llama2c/stories260K.bin: fetched", said)
        self.assertIn("every file as published and converted", said)
        for name, files in MODELS.items():
            for f in files:
                mine = os.path.join(models, name, f.path)
                if f.path == "reference_outputs.json":
                    continue  # a float32 run: verify compares it by value
                with open(mine, "rb") as a, open(os.path.join(SHARED, name, f.path), "rb") as b:
                    self.assertEqual(a.read(), b.read(), f"{name}/{f.path}")
        self.assertFalse([p for _, _, names in os.walk(models) for p in names
                          if p.endswith(".partial")])
        # A second fetch finds every file present; verify alone passes.
        code, said = run("fetch", "--models", models, "--mirror", mirror_url(SHARED),
                         "--no-convert")
        self.assertEqual(code, 0, said)
        self.assertIn("mobilenet_v2/images/owl.jpg: present", said)
        self.assertEqual(run("verify", "--models", models)[0], 0)
        # A converted file changed: verify names it.
        with open(os.path.join(models, "stories260K", "config.json"), "a") as f:
            f.write(" ")
        code, said = run("verify", "--models", models)
        self.assertEqual(code, 1)
        self.assertIn("stories260K/config.json: WRONG: sha256", said)

    def test_convert_needs_the_originals(self):
        models = tempfile.mkdtemp()
        code, said = run("convert", "--models", models, "--model", "stories260K")
        self.assertEqual(code, 1)
        self.assertIn("no llama2c/stories260K.bin, llama2c/tok512.bin, LICENSE (run `python -m "
                      "kvsim.models fetch` first)", said)


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """A file server on the loopback that honours `Range: bytes=N-` (206), or ignores it (200)
    when the class says so, as some servers do."""
    honour_range = True

    def do_GET(self):
        path = self.translate_path(self.path)
        with open(path, "rb") as f:
            data = f.read()
        start = 0
        if self.honour_range and self.headers.get("Range", "").startswith("bytes="):
            start = int(self.headers["Range"][6:].rstrip("-"))
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:])

    def log_message(self, *args):
        pass


class OverHttp(unittest.TestCase):
    def serve(self, honour_range):
        handler = type("Handler", (RangeHandler,), {"honour_range": honour_range})
        directory = os.path.join(SHARED, "stories260K")
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(handler, directory=directory))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        return f"http://127.0.0.1:{server.server_address[1]}/llama2c/tok512.bin"

    def resume(self, honour_range):
        f = original("stories260K", "llama2c/tok512.bin")
        dest = os.path.join(tempfile.mkdtemp(), "tok512.bin")
        with open(os.path.join(SHARED, "stories260K", f.path), "rb") as src, \
                open(dest + ".partial", "wb") as out:
            out.write(src.read(2000))
        how = fetch_file(self.serve(honour_range), dest, f.sha256, f.size)
        self.assertEqual(sha256_of(dest), f.sha256)
        return how

    def test_a_partial_download_resumes_with_a_range_request(self):
        self.assertEqual(self.resume(honour_range=True), "resumed")

    def test_a_server_that_ignores_the_range_sends_the_whole_file(self):
        self.assertEqual(self.resume(honour_range=False), "fetched")


class Downloads(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.file = original("stories260K", "llama2c/tok512.bin")
        self.source = os.path.join(SHARED, "stories260K", self.file.path)
        self.dest = os.path.join(self.dir, "tok512.bin")

    def test_a_wrong_checksum_keeps_nothing(self):
        bad = os.path.join(self.dir, "mirror", "tok512.bin")
        os.makedirs(os.path.dirname(bad))
        shutil.copyfile(self.source, bad)
        with open(bad, "r+b") as f:
            f.seek(100)
            f.write(b"\xff")
        with self.assertRaises(FetchError) as e:
            fetch_file(mirror_url(bad), self.dest, self.file.sha256, self.file.size)
        self.assertIn(f"{self.dest}: the file at {mirror_url(bad)} has sha256", str(e.exception))
        self.assertIn(f"expected {self.file.sha256}", str(e.exception))
        self.assertEqual(os.listdir(self.dir), ["mirror"])  # no file, no .partial

    def test_a_partial_download_resumes(self):
        with open(self.source, "rb") as f:
            head = f.read(1000)
        with open(self.dest + ".partial", "wb") as f:
            f.write(head)
        how = fetch_file(mirror_url(self.source), self.dest, self.file.sha256, self.file.size)
        self.assertEqual(how, "resumed")
        self.assertEqual(sha256_of(self.dest), self.file.sha256)
        self.assertFalse(os.path.exists(self.dest + ".partial"))

    def test_a_partial_download_of_the_whole_size_is_only_checked(self):
        # a Range request from its end would be refused (416): nothing is fetched
        shutil.copyfile(self.source, self.dest + ".partial")
        nowhere = mirror_url(os.path.join(self.dir, "nowhere.bin"))
        self.assertEqual(fetch_file(nowhere, self.dest, self.file.sha256, self.file.size),
                         "resumed")
        self.assertEqual(sha256_of(self.dest), self.file.sha256)

    def test_a_corrupt_partial_download_restarts(self):
        with open(self.dest + ".partial", "wb") as f:
            f.write(b"\0" * 1000)  # not the file's first bytes: the resumed file is wrong
        with self.assertRaises(FetchError):
            fetch_file(mirror_url(self.source), self.dest, self.file.sha256, self.file.size)
        self.assertFalse(os.path.exists(self.dest + ".partial"))
        self.assertEqual(fetch_file(mirror_url(self.source), self.dest, self.file.sha256,
                                    self.file.size), "fetched")
        self.assertEqual(sha256_of(self.dest), self.file.sha256)

    def test_a_different_file_in_place_is_not_overwritten(self):
        with open(self.dest, "wb") as f:
            f.write(b"mine")
        with self.assertRaises(FetchError) as e:
            fetch_file(mirror_url(self.source), self.dest, self.file.sha256, self.file.size)
        self.assertIn("a different file is there", str(e.exception))
        with open(self.dest, "rb") as f:
            self.assertEqual(f.read(), b"mine")

    def test_an_unreachable_url_is_named(self):
        url = mirror_url(os.path.join(self.dir, "nowhere.bin"))
        with self.assertRaises(FetchError) as e:
            fetch_file(url, self.dest, self.file.sha256, self.file.size)
        self.assertIn(url, str(e.exception))


if __name__ == "__main__":
    main_or_skip(["stories260K/llama2c/stories260K.bin", "mobilenet_v2/images/owl.jpg"],
                 "the original model files")
