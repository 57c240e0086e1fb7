"""A tiny HTTP service for supervisor tests, run as ``python -m tests.hybrid_llm.tiny_server``.

``/ready`` is 503 until ``--ready-after`` seconds passed, then 200; ``/pid``
answers the process id; ``/crash`` exits with status 3. ``--ignore-term``
makes it shrug off SIGTERM (so the supervisor has to SIGKILL it).
``--worker-session`` starts a sleeping worker in a session of its own (as the
central gateway starts replicas) that the server never stops; ``/worker``
answers its pid. ``--worker-group`` starts one in its own process group (as
vLLM's engine core runs), which outlives the server unless the group is stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ready-after", type=float, default=0.0)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--fail-start", action="store_true")
    parser.add_argument("--worker-session", action="store_true")
    parser.add_argument("--worker-group", action="store_true")
    args = parser.parse_args()
    if args.fail_start:
        print("tiny_server: refusing to start (--fail-start)", flush=True)
        raise SystemExit(4)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    started = time.monotonic()
    worker = None
    if args.worker_session or args.worker_group:
        worker = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            start_new_session=args.worker_session,
        )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/crash":
                os._exit(3)
            if self.path == "/pid":
                self._send(200, str(os.getpid()))
            elif self.path == "/worker":
                self._send(200 if worker else 404, str(worker.pid) if worker else "none")
            elif self.path == "/ready":
                ok = time.monotonic() - started >= args.ready_after
                self._send(200 if ok else 503, "ready" if ok else "starting")
            else:
                self._send(404, "no")

        def _send(self, status: int, text: str) -> None:
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"tiny_server on {args.port}", flush=True)
    if not args.ignore_term:
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
