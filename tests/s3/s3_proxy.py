"""A loopback HTTP proxy in front of an S3 server, for the s3 transport's fault tests: it forwards
every request unchanged (Host header included, so SigV4 signatures still verify), records each one,
and answers 503 SlowDown instead of forwarding where the test's policy says so."""
import http.client
import http.server
import threading

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}
SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class Proxy:
    """fail(index, method, path) -> True answers that request (0-based index) with a 503."""

    def __init__(self, upstream_port, fail=None):
        self.upstream_port = upstream_port
        self.fail = fail or (lambda index, method, path: False)
        self.lock = threading.Lock()
        self.requests = []  # (method, path, status) in arrival order
        self.down = False  # True: every connection is dropped unanswered, like a dead server's
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_any(self):
                if proxy.down:
                    self.close_connection = True
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy.lock:
                    index = len(proxy.requests)
                    proxy.requests.append([self.command, self.path, None])
                if proxy.fail(index, self.command, self.path):
                    head = self.command == "HEAD"  # a HEAD answer has headers only
                    self.reply(index, 503, [("Content-Type", "application/xml")],
                               b"" if head else SLOW_DOWN)
                    return
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                    conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for name, value in self.headers.items():
                        if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                            conn.putheader(name, value)
                    if self.command not in ("GET", "HEAD", "DELETE") or body:
                        conn.putheader("Content-Length", str(len(body)))
                    conn.endheaders(body)
                    resp = conn.getresponse()
                    data = resp.read()
                    headers = [(k, v) for k, v in resp.getheaders()
                               if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"]
                    conn.close()
                except OSError:
                    # The server is gone: drop the client's connection like a dead server would.
                    with proxy.lock:
                        proxy.requests[index][2] = "reset"
                    self.close_connection = True
                    return
                if self.command == "HEAD":
                    headers.append(("Content-Length", resp.getheader("Content-Length") or "0"))
                    self.reply(index, resp.status, headers, b"", head=True)
                else:
                    self.reply(index, resp.status, headers, data)

            def reply(self, index, status, headers, data, head=False):
                with proxy.lock:
                    proxy.requests[index][2] = status
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if data:
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def snapshot(self):
        with self.lock:
            return [tuple(r) for r in self.requests]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
