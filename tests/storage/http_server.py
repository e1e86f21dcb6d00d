#!/usr/bin/python3
"""A loopback HTTP server for tests/storage/test_storage_http.c.

Serves the files of DIR (argv[1]) under a mode chosen by the first path
segment, prints "PORT <n>" on stdout once it listens on 127.0.0.1, and
serves until killed. Modes, as the HTTP fetcher must meet them:

  /range/NAME     honours a single `Range: bytes=a-b` (206, Content-Range),
                  with a strong ETag; `If-Range` that does not match -> 200
                  with the whole file (RFC 9110 13.1.5)
  /ignore/NAME    ignores Range: always 200 with the whole file (as Python's
                  own http.server does), same ETag
  /change/NAME    as /range, but the ETag changes on every request (an object
                  rewritten between requests)
  /flaky/NAME     as /range, but the first request of each distinct Range
                  answers 500
  /down/NAME      always 503
  /slow/NAME      sleeps 5 s, then as /range
  /liar/NAME      as /range, but Content-Range names the range one byte on
                  (for ranges that do not start at 0)
  /redirect/NAME  302 to /range/NAME
"""
import email.utils
import http.server
import os
import re
import sys
import threading
import time

ROOT = sys.argv[1]
lock = threading.Lock()
seen = set()
counter = [0]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def handle(self):
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):
            pass  # the client stopped reading a body it did not need

    def send_plain(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        parts = self.path.split("?", 1)[0].split("/", 2)
        if len(parts) < 3:
            return self.send_plain(404)
        mode, name = parts[1], parts[2]
        path = os.path.join(ROOT, os.path.basename(name))
        if not os.path.isfile(path):
            return self.send_plain(404, b"no such file")
        with open(path, "rb") as f:
            data = f.read()
        st = os.stat(path)
        etag = '"%d-%d"' % (st.st_size, st.st_mtime_ns)
        rng = self.headers.get("Range")
        if mode == "change":
            with lock:
                counter[0] += 1
                etag = '"v%d"' % counter[0]
        elif mode == "flaky":
            with lock:
                key = (name, rng)
                first = key not in seen
                seen.add(key)
            if first:
                return self.send_plain(500, b"try again")
        elif mode == "down":
            return self.send_plain(503, b"down")
        elif mode == "slow":
            time.sleep(5)
        elif mode == "redirect":
            self.send_response(302)
            self.send_header("Location", "/range/" + name)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        elif mode not in ("range", "ignore", "liar"):
            return self.send_plain(404, b"no such mode")
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", rng or "")
        if_range = self.headers.get("If-Range")
        if m and rng != "bytes=0-0" and mode != "ignore" and not if_range:
            # the fetcher must guard every block read against a new version
            return self.send_plain(400, b"If-Range required")
        if mode == "ignore" or not m or (if_range and if_range != etag):
            self.send_response(200)
            self.send_header("ETag", etag)
            self.send_header("Last-Modified",
                             email.utils.formatdate(st.st_mtime, usegmt=True))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            return
        a, b = int(m.group(1)), int(m.group(2))
        if a >= len(data):
            self.send_response(416)
            self.send_header("Content-Range", "bytes */%d" % len(data))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        b = min(b, len(data) - 1)
        body = data[a:b + 1]
        shown = (a + 1, b + 1) if mode == "liar" and a > 0 else (a, b)
        self.send_response(206)
        self.send_header("ETag", etag)
        self.send_header("Content-Range",
                         "bytes %d-%d/%d" % (shown[0], shown[1], len(data)))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    print("PORT %d" % srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
