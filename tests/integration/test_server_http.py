"""``nanscope serve`` over real HTTP: binding, read-only routes, static files, errors, Jupyter."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

import pytest

from nanscope.server import ServeError, Server, serve_in_thread
from tests.helpers import write_small_dump


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[Server]:
    write_small_dump(tmp_path, n=20, bad=(6,))
    s = serve_in_thread(tmp_path)
    yield s
    s.close()


def request(
    server: Server, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_json(server: Server, path: str, **kw: Any) -> tuple[int, Any]:
    status, headers, body = request(server, path, **kw)
    assert headers["content-type"].startswith("application/json")
    return status, json.loads(body)


def test_binds_loopback_by_default_and_answers_json(server: Server) -> None:
    assert server.host == "127.0.0.1" and server.url == f"http://127.0.0.1:{server.port}/"
    status, body = get_json(server, "/api/runs")
    assert status == 200 and body["runs"][0]["num_executions"] == 20
    status, body = get_json(server, "/api/alerts")
    assert status == 200 and body["first"] == {"kind": "execution", "index": 6}


def test_page_and_static_files(server: Server) -> None:
    status, headers, body = request(server, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    # Nothing is loaded from elsewhere.
    assert b"<html" in body.lower() and not re.search(rb"""(src|href)=["']?(https?:)?//""", body)
    assert "script-src 'self'" in headers["content-security-policy"]
    scripts = [p for p in (Path(__file__).parents[2] / "src/nanscope/server/static").glob("*.js")]
    assert scripts
    status, headers, _ = request(server, f"/static/{scripts[0].name}")
    assert status == 200 and headers["content-type"].startswith("text/javascript")


@pytest.mark.parametrize(
    "path",
    ["/static/../api.py", "/static/%2e%2e/api.py", "/static/..%2fruns.py", "/static//etc/passwd",
     "/static/nope.js", "/etc/passwd", "/api/nope"],
)  # fmt: skip
def test_nothing_outside_static_is_served(server: Server, path: str) -> None:
    status, _, body = request(server, path)
    assert status == 404 and b"def " not in body and b"root:" not in body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_read_only(server: Server, method: str) -> None:
    status, body = get_json(server, "/api/runs", method=method)
    assert status == 405 and "read-only" in body["error"]


def test_bad_parameter_is_400_with_a_message(server: Server) -> None:
    status, body = get_json(server, "/api/executions?begin=0&end=99999999")
    assert status == 400 and "at most 1000" in body["error"]
    status, body = get_json(server, "/api/executions?begin=" + "1" * 5000)
    assert status == 400 and "longer than" in body["error"]


def test_foreign_host_header_is_refused(server: Server) -> None:
    """A page on another site cannot read the API through DNS rebinding."""
    status, body = get_json(server, "/api/runs", headers={"Host": "evil.example:80"})
    assert status == 403 and "127.0.0.1" in body["error"]
    assert get_json(server, "/api/runs", headers={"Host": f"localhost:{server.port}"})[0] == 200


def test_port_in_use_is_a_clear_error(server: Server, tmp_path: Path) -> None:
    with pytest.raises(ServeError, match=f"port {server.port} on 127.0.0.1 is in use"):
        Server(tmp_path, port=server.port)
    proc = subprocess.run(
        [sys.executable, "-m", "nanscope", "serve", str(tmp_path), "--port", str(server.port)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"nanscope serve: error: port {server.port} on 127.0.0.1 is in use; pick another with "
        "--port (--port 0 picks a free one)"
    ]


def test_missing_logdir_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "nanscope", "serve", str(tmp_path / "nope"), "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "nope: no such directory" in line


def test_cli_prints_the_url_and_serves(tmp_path: Path) -> None:
    write_small_dump(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nanscope", "serve", str(tmp_path), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert "(1 run)" in lines[0]
        url = lines[1].split("open ", 1)[1].split()[0]
        parts = urlsplit(url)
        assert parts.hostname == "127.0.0.1"
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request("GET", "/api/runs")
        assert json.loads(conn.getresponse().read())["runs"][0]["num_executions"] == 10
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_empty_logdir_waits_for_a_dump(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path) as s:
        status, body = get_json(s, "/api/runs")
        assert status == 200 and body["runs"] == []
        status, body = get_json(s, "/api/alerts")
        assert status == 404 and "no dump" in body["error"]


def test_concurrent_clients_while_the_dump_grows(tmp_path: Path) -> None:
    """Readers in many threads and a writer still appending: every answer is whole JSON."""
    from nanscope.events import DumpWriter, ExecutionEvent
    from tests.helpers import full_health

    writer = DumpWriter(tmp_path, "FULL_HEALTH", circular_buffer_size=-1, flush_interval=0.05)
    writer.write_execution(ExecutionEvent("op", [1], [0], summaries=[full_health()]))
    writer.flush()
    errors: list[str] = []
    with serve_in_thread(tmp_path) as s:

        def client() -> None:
            for k in range(15):
                path = ["/api/runs", "/api/alerts", "/api/executions?begin=0&end=50",
                        "/api/timeline?buckets=50"][k % 4]  # fmt: skip
                status, _, body = request(s, path)
                if status != 200:
                    errors.append(f"{path}: {status} {body[:200]!r}")
                json.loads(body)

        threads = [threading.Thread(target=client) for _ in range(6)]
        for t in threads:
            t.start()
        for i in range(2000):
            writer.write_execution(
                ExecutionEvent("op", [i + 2], [i + 1], summaries=[full_health()], step=i)
            )
        for t in threads:
            t.join(timeout=60)
        writer.close()
        assert not errors
        # Caught up within a refresh interval or two.
        for _ in range(50):
            if get_json(s, "/api/runs")[1]["runs"][0]["num_executions"] == 2001:
                break
            threading.Event().wait(0.1)
        assert get_json(s, "/api/runs")[1]["runs"][0]["num_executions"] == 2001


def test_beyond_loopback_a_token_is_required(tmp_path: Path) -> None:
    """Bound beyond loopback: a random token in the URL, required by every route and file."""
    write_small_dump(tmp_path)
    with Server(tmp_path, host="0.0.0.0", port=0).start() as s:
        assert s.token and len(s.token) >= 32
        assert urlsplit(s.url).query == f"token={s.token}"
        for path in ("/api/runs", "/", "/static/app.js", "/api/executions/3"):
            status, _, body = request(s, path)
            assert status == 401 and b"token" in body
        assert request(s, "/api/runs?token=wrong")[0] == 401
        assert request(s, "/api/runs", headers={"Authorization": "token wrong"})[0] == 401
        status, body = get_json(s, f"/api/runs?token={s.token}")
        assert status == 200 and body["runs"][0]["num_executions"] == 10
        assert request(s, "/api/runs", headers={"Authorization": f"token {s.token}"})[0] == 200
        assert request(s, "/api/runs", headers={"Authorization": f"Bearer {s.token}"})[0] == 200
        # Opening the page with the token keeps it in a cookie and takes it out of the URL.
        status, headers, _ = request(s, f"/?token={s.token}")
        assert status == 303 and headers["location"] == "/"
        cookie = headers["set-cookie"]
        assert cookie.startswith(f"nanscope_token_{s.port}={s.token};")
        assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
        jar = {"Cookie": f"nanscope_token_{s.port}={s.token}"}
        assert request(s, "/", headers=jar)[0] == 200
        assert get_json(s, "/api/alerts", headers=jar)[0] == 200
        assert request(s, "/api/runs", headers={"Cookie": f"nanscope_token_{s.port}=x"})[0] == 401


def test_beyond_loopback_the_host_check_stays(tmp_path: Path) -> None:
    """Names that are not this machine's are refused even with the token (DNS rebinding);
    IP addresses, this machine's name, loopback names and --allow-host names are served."""
    write_small_dump(tmp_path)
    with Server(tmp_path, host="0.0.0.0", port=0, allow_hosts=["Box.Example"]).start() as s:
        auth = {"Authorization": f"token {s.token}"}
        status, body = get_json(s, "/api/runs", headers={**auth, "Host": "evil.example:80"})
        assert status == 403 and "--allow-host" in body["error"]
        for host in ("10.1.2.3:6007", "[fe80::1]:6007", "localhost", "box.example:1",
                     f"{socket.gethostname()}:{s.port}"):  # fmt: skip
            assert get_json(s, "/api/runs", headers={**auth, "Host": host})[0] == 200, host
        assert urlsplit(s.url).hostname == socket.gethostname().lower()


def test_loopback_with_a_given_token(tmp_path: Path) -> None:
    """A token given for a loopback server is required too; none is asked for by default."""
    write_small_dump(tmp_path)
    with serve_in_thread(tmp_path, token="s3cret") as s:
        assert s.url == f"http://127.0.0.1:{s.port}/?token=s3cret"
        assert request(s, "/api/runs")[0] == 401
        assert request(s, "/api/runs?token=s3cret")[0] == 200
    with serve_in_thread(tmp_path) as s:
        assert s.token is None and request(s, "/api/runs")[0] == 200


def _serve_cli(logdir: Path, host: str, **env: str) -> tuple[subprocess.Popen[str], SplitResult]:
    """A real ``nanscope serve`` on ``host`` and a free port, and the URL it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nanscope", "serve", str(logdir), "--port", "0", "--host", host],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
    )  # fmt: skip
    assert proc.stdout is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]
    return proc, urlsplit(lines[1].split("open ", 1)[1].split()[0])


def test_cli_beyond_loopback_prints_the_token_url(tmp_path: Path) -> None:
    write_small_dump(tmp_path)
    proc, parts = _serve_cli(tmp_path, "0.0.0.0", NANSCOPE_TOKEN="fixed-token-for-the-test")
    try:
        assert parts.query == "token=fixed-token-for-the-test"
        conn = http.client.HTTPConnection("127.0.0.1", parts.port, timeout=10)
        conn.request("GET", "/api/runs")
        assert conn.getresponse().status == 401
        conn = http.client.HTTPConnection("127.0.0.1", parts.port, timeout=10)
        conn.request("GET", f"/api/runs?{parts.query}")
        assert json.loads(conn.getresponse().read())["runs"][0]["num_executions"] == 10
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "needs the token in the URL" in err


def test_cli_on_another_loopback_address_prints_a_url_that_answers(tmp_path: Path) -> None:
    """127.0.0.0/8 is loopback (on Linux every address of it is bound to ``lo``): the URL
    that ``nanscope serve --host 127.0.0.2`` prints must pass the server's Host check."""
    write_small_dump(tmp_path)
    proc, parts = _serve_cli(tmp_path, "127.0.0.2")
    try:
        assert parts.hostname == "127.0.0.2" and not parts.query  # loopback: no token
        for path in (parts.path or "/", "/api/runs", "/static/app.js"):
            # As a browser opening the URL sends it: Host is the URL's host and port.
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200, (path, resp.status, body[:200])
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request("GET", "/api/runs")
        assert json.loads(conn.getresponse().read())["runs"][0]["num_executions"] == 10
        # A name is still refused (DNS rebinding).
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request("GET", "/api/runs", headers={"Host": f"evil.example:{parts.port}"})
        assert conn.getresponse().status == 403
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_static_names_too_long_or_odd_are_404_over_http(server: Server) -> None:
    for name in ("a" * 300, "%C3%A9" * 200, "a%00b", ".hidden"):
        status, body = get_json(server, f"/static/{name}")
        assert status == 404 and "no such file" in body["error"], (name, status)


# -- connections ------------------------------------------------------------------------------


def open_idle(port: int, n: int) -> list[socket.socket]:
    """``n`` connections that send nothing (connected: queued by the kernel if not accepted)."""
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        socks.append(sock)
    return socks


def closed_by_server(sock: socket.socket, wait: float) -> bool:
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_idle_connections_cannot_keep_a_request_out(tmp_path: Path) -> None:
    """Past the connection cap, the oldest idle connections are closed to make room."""
    write_small_dump(tmp_path)
    with serve_in_thread(tmp_path, max_connections=20) as s:
        idle = open_idle(s.port, 200)
        try:
            status, body = get_json(s, "/api/runs")  # request() gives up after 10 s
            assert status == 200 and body["runs"][0]["num_executions"] == 10
            # The first idle ones were closed, the latest are still open.
            assert closed_by_server(idle[0], 5)
            assert not closed_by_server(idle[-1], 0.2)
        finally:
            for sock in idle:
                sock.close()


def until(condition: Callable[[], object], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_when_every_connection_is_busy_a_new_one_gets_503(tmp_path: Path) -> None:
    write_small_dump(tmp_path)
    with serve_in_thread(tmp_path, max_connections=1) as s:
        get_json(s, "/api/runs")
        run = s.runs.get(None)
        until(lambda: not s._httpd._open)  # that request's connection is closed
        with run._rw.exclusive():  # the run is being caught up: its readers wait
            busy = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            busy.sendall(b"GET /api/alerts HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            until(lambda: any(list(s._httpd._open.values())))  # its request is read
            status, headers, body = request(s, "/api/runs")
            assert status == 503 and headers["retry-after"] == "1"
            assert "busy" in json.loads(body)["error"]
        answer = busy.makefile("rb").read()
        busy.close()
        assert answer.startswith(b"HTTP/1.0 200")
        assert get_json(s, "/api/runs")[0] == 200


def test_idle_and_slow_connections_time_out(tmp_path: Path) -> None:
    write_small_dump(tmp_path)
    with serve_in_thread(tmp_path, connection_timeout=0.5) as s:
        idle, slow = open_idle(s.port, 2)
        slow.sendall(b"GET /api/runs HTTP/1.0\r\nHost: 127.0.0.1\r\n")  # headers never end
        assert closed_by_server(idle, 10) and closed_by_server(slow, 10)
        idle.close()
        slow.close()
        assert get_json(s, "/api/runs")[0] == 200


def test_idle_connections_at_a_low_descriptor_limit(tmp_path: Path) -> None:
    """A server allowed 64 descriptors still answers while 200 idle connections are held."""
    write_small_dump(tmp_path)
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64));"
        "from nanscope.cli.main import main; sys.exit(main())"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "serve", str(tmp_path), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    idle: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        port = urlsplit(lines[1].split("open ", 1)[1].split()[0]).port
        assert port is not None
        idle = open_idle(port, 200)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/api/runs")
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["runs"][0]["num_executions"] == 10
    finally:
        for sock in idle:
            sock.close()
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "Traceback" not in err


def test_jupyter_magic_shows_the_gui(tmp_path: Path) -> None:
    pytest.importorskip("IPython")
    from IPython.testing.globalipapp import get_ipython

    from nanscope import notebook

    write_small_dump(tmp_path)
    ip = get_ipython()  # type: ignore[no-untyped-call]  # IPython's test helper is unannotated
    ip.run_line_magic("load_ext", "nanscope")
    try:
        frame = ip.run_line_magic("nanscope", f"{tmp_path} --height 500")
        assert 'height="500"' in frame._repr_html_() and frame.src.startswith("http://127.0.0.1:")
        # The same logdir reuses its server.
        assert ip.run_line_magic("nanscope", str(tmp_path)).src == frame.src
        parts = urlsplit(frame.src)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request("GET", "/api/runs")
        assert json.loads(conn.getresponse().read())["runs"][0]["num_executions"] == 10
        with pytest.raises(ValueError, match="usage: %nanscope LOGDIR"):
            ip.run_line_magic("nanscope", "")
    finally:
        notebook.stop_all()
