"""The TensorBoard plugin: ``tensorboard --logdir LOGDIR`` shows a "nanscope" tab.

The module starts TensorBoard of this environment (``tensorboard.main``, the ``tensorboard``
program's own entry) on a free port of 127.0.0.1, over a logdir holding two runs: ``torch``,
written by a real PyTorch program (``tests/programs/log_of_zero.py``), and ``tf``, TensorFlow's
golden FULL_HEALTH dump. TensorFlow is hidden from that process (``sys.modules["tensorflow"]
= None``): TensorBoard runs in its reduced mode, as where TensorFlow is not installed, and the
plugin must work there. TensorBoard finds the plugin through its ``tensorboard_plugins`` entry
point: the installed one when this checkout is installed (``pip install -e .``, as CI does),
else the same entry point declared by a throwaway ``.dist-info`` on ``PYTHONPATH``.

The API is checked through TensorBoard's HTTP server, then Debian's Chromium (Playwright;
never downloaded) opens TensorBoard's ``#nanscope`` tab and reads nanscope's page inside its
iframe. No request may leave 127.0.0.1. TensorBoard serves under ``--path_prefix /tb`` (as
behind a proxy), so the page's relative URLs are checked too.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorboard")

import nanscope
from nanscope.integrations.tensorboard import NanscopeLoader

from ..helpers import chromium, extract_tf_dumps

pytestmark = [pytest.mark.tensorboard, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "tests" / "programs" / "log_of_zero.py"
ENTRY_POINT = "nanscope.integrations.tensorboard:NanscopeLoader"
STARTUP_TIMEOUT_S = 60.0
# TensorBoard's own `tensorboard` program, with TensorFlow made unimportable first.
TENSORBOARD_WITHOUT_TF = (
    "import sys; sys.modules['tensorflow'] = None; "
    "from tensorboard.main import run_main; run_main()"
)
# TensorBoard's warning for a response without Content-Type, nosniff or a valid CSP.
VALIDATOR_WARNING = "this warning will become an error"
PREFIX = "/tb"  # TensorBoard's --path_prefix
PROXY_HOST = "proxy.example"  # --nanscope_allow_host

# Never through a proxy, whatever the environment says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _installed_entry_points() -> list[importlib.metadata.EntryPoint]:
    return [
        ep
        for ep in importlib.metadata.entry_points(group="tensorboard_plugins")
        if ep.name == "nanscope"
    ]


# -- the entry point ---------------------------------------------------------------------------


def test_pyproject_declares_the_entry_point() -> None:
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.entry-points.tensorboard_plugins]", 1)[1].split("\n[", 1)[0]
    assert f'nanscope = "{ENTRY_POINT}"' in section
    ep = importlib.metadata.EntryPoint("nanscope", ENTRY_POINT, "tensorboard_plugins")
    assert ep.load() is NanscopeLoader


def test_installed_entry_point() -> None:
    """The installed metadata names the loader, where this checkout is the one installed."""
    found = _installed_entry_points()
    if not found:
        dist = importlib.metadata.distribution("nanscope")
        origin = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        if origin.rstrip("/") != REPO.as_uri():
            pytest.skip(f"nanscope is installed from {origin or 'elsewhere'}, not this checkout")
        pytest.fail("the installed metadata lacks the entry point: run `pip install -e .` again")
    assert [ep.value for ep in found] == [ENTRY_POINT]
    assert found[0].load() is NanscopeLoader


def test_importing_needs_neither_tensorflow_nor_tensorboard() -> None:
    """``import nanscope`` imports no TensorBoard; the plugin's module imports no TensorFlow."""
    code = (
        "import sys, nanscope\n"
        "assert 'tensorboard' not in sys.modules\n"
        "import nanscope.integrations.tensorboard\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]


# -- TensorBoard over a logdir -----------------------------------------------------------------


@dataclass
class TensorBoard:
    url: str  # http://127.0.0.1:PORT/tb/
    log: Path

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
        """GET ``path`` (relative to the root): status, headers, body."""
        req = urllib.request.Request(self.url + path.lstrip("/"), headers=headers or {})
        try:
            with _OPENER.open(req, timeout=30) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read()

    def json(self, path: str) -> Any:
        status, _, body = self.get(path)
        assert status == 200, (path, status, body[:500])
        return json.loads(body)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry_point_shim(root: Path) -> Path:
    """A directory holding only a ``.dist-info`` that declares the plugin's entry point, for
    TensorBoard's ``importlib.metadata`` lookup where this checkout is not the one installed."""
    info = root / "nanscope_tensorboard_test-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nanscope-tensorboard-test\nVersion: 0\n"
    )
    (info / "entry_points.txt").write_text(f"[tensorboard_plugins]\nnanscope = {ENTRY_POINT}\n")
    return root


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("tblogdir")
    out = subprocess.run(
        [sys.executable, str(PROGRAM), str(root / "torch")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    extract_tf_dumps(root, only="FULL_HEALTH")
    (root / "FULL_HEALTH").rename(root / "tf")
    return root


@pytest.fixture(scope="module")
def tensorboard(logdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TensorBoard]:
    work = tmp_path_factory.mktemp("tensorboard")
    # The nanscope under test (this checkout's src/ when run from it) comes first.
    paths = [str(Path(nanscope.__file__).resolve().parents[1])]
    if not _installed_entry_points():
        paths.append(str(_entry_point_shim(work / "shim")))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]),
        # Nothing leaves this machine: no proxy, and TensorBoard fetches nothing itself.
        "NO_PROXY": "*",
        "no_proxy": "*",
        "CUDA_VISIBLE_DEVICES": "",
    }
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        env.pop(name, None)
    port = _free_port()
    log = work / "tensorboard.log"
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable, "-c", TENSORBOARD_WITHOUT_TF,
                "--logdir", str(logdir),
                "--host", "127.0.0.1",
                "--port", str(port),
                "--load_fast", "false",  # no separate data server process
                "--path_prefix", PREFIX,
                "--nanscope_allow_host", PROXY_HOST,
            ],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=work,
            start_new_session=True,  # its own process group, stopped as a whole below
        )  # fmt: skip
    try:
        tb = TensorBoard(f"http://127.0.0.1:{port}{PREFIX}/", log)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"tensorboard exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
                )
            with contextlib.suppress(OSError):
                if tb.get("data/plugins_listing")[0] == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"tensorboard did not answer in {STARTUP_TIMEOUT_S} s:\n"
                            f"{log.read_text()[-3000:]}")  # fmt: skip
            time.sleep(0.25)
        yield tb
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)


def test_the_tab_is_listed_and_tensorflow_is_absent(tensorboard: TensorBoard) -> None:
    listing = tensorboard.json("data/plugins_listing")
    tab = listing["nanscope"]
    assert tab["enabled"] is True  # is_active(): dumps are under the logdir
    assert tab["tab_name"] == "nanscope"
    assert tab["loading_mechanism"] == {
        "type": "IFRAME",
        "module_path": f"{PREFIX}/data/plugin/nanscope/entry.js",
    }
    assert "TensorFlow installation not found" in tensorboard.log.read_text()


def test_api_through_tensorboard(tensorboard: TensorBoard) -> None:
    runs = tensorboard.json("data/plugin/nanscope/api/runs")["runs"]
    by_name = {r["run"]: r for r in runs}
    assert set(by_name) == {"torch", "tf"}
    assert by_name["torch"]["framework"].startswith("torch ")
    assert by_name["tf"]["framework"].startswith("tensorflow ")
    analysis = tensorboard.json("data/plugin/nanscope/api/analysis?run=torch")
    assert analysis["origin"]["op_type"] == "aten.log.default"
    assert analysis["origin"]["inputs"][0]["counts"]["zero"] > 0
    tf = tensorboard.json("data/plugin/nanscope/api/analysis?run=tf")
    assert tf["found_nonfinite"] is True

    # The page and its scripts, under nanscope's Content-Security-Policy.
    status, headers, body = tensorboard.get("data/plugin/nanscope/index.html")
    assert status == 200 and b'src="static/app.js"' in body
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    status, headers, _ = tensorboard.get("data/plugin/nanscope/static/app.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    status, headers, body = tensorboard.get("data/plugin/nanscope/entry.js")
    assert status == 200 and b"export function render" in body
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_nanscope_rules_hold_under_tensorboard(tensorboard: TensorBoard) -> None:
    # TensorBoard listens on loopback: another Host name (DNS rebinding) is refused.
    status, _, body = tensorboard.get(
        "data/plugin/nanscope/api/runs", headers={"Host": "attacker.example"}
    )
    assert status == 403 and b"not served here" in body
    # ... unless named by --nanscope_allow_host (a proxy's name).
    status, _, _ = tensorboard.get("data/plugin/nanscope/api/runs", headers={"Host": PROXY_HOST})
    assert status == 200
    # Only GET; no file outside the page's own; no source file the dump did not record.
    req = urllib.request.Request(tensorboard.url + "data/plugin/nanscope/api/runs", method="POST")
    with pytest.raises(urllib.error.HTTPError) as exc:
        _OPENER.open(req, timeout=10)
    assert exc.value.code == 405
    assert tensorboard.get("data/plugin/nanscope/static/..%2f..%2fapp.py")[0] == 404
    status, _, _ = tensorboard.get(
        "data/plugin/nanscope/api/source?run=torch&process=0&path=" + urllib.parse.quote(__file__)
    )
    assert status == 404
    # Every answer passed TensorBoard's response validator (Content-Type, nosniff, CSP).
    assert VALIDATOR_WARNING not in tensorboard.log.read_text()


# -- in a browser ------------------------------------------------------------------------------

# Reports Content-Security-Policy violations of every frame (the iframe's too) to Python.
CSP_WATCH = """
document.addEventListener("securitypolicyviolation", (e) =>
  window.__nanscopeCsp(`${location.pathname}: ${e.violatedDirective} blocked `
                       + `${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`));
"""
PLUGIN_PATH = f"{PREFIX}/data/plugin/nanscope/"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture()
def images(tmp_path: Path) -> Path:
    """docs/images with NANSCOPE_SCREENSHOTS=1, else a temporary folder."""
    return REPO / "docs" / "images" if os.environ.get("NANSCOPE_SCREENSHOTS") else tmp_path


def _nanscope_frame(page: Any) -> Any:
    """The frame showing nanscope's page (the tab's iframe, once entry.js navigated it)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for frame in page.frames:
            if urllib.parse.urlsplit(frame.url).path == PLUGIN_PATH + "index.html":
                return frame
        page.wait_for_timeout(100)
    pytest.fail(f"no nanscope frame; frames: {[f.url for f in page.frames]}")


def test_the_nanscope_tab_in_a_browser(
    tensorboard: TensorBoard, browser: Any, images: Path
) -> None:
    errors: list[str] = []
    outside: list[str] = []
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})

    def only_local(route: Any) -> None:
        host = urllib.parse.urlsplit(route.request.url).hostname
        if route.request.url.startswith(("data:", "blob:")) or host == "127.0.0.1":
            route.continue_()
        else:  # TensorBoard or the page reaching out: refused, and the test fails
            outside.append(route.request.url)
            route.abort()

    ctx.route("**/*", only_local)
    ctx.expose_function("__nanscopeCsp", lambda text: errors.append(text))
    ctx.add_init_script(CSP_WATCH)
    page = ctx.new_page()
    page.set_default_timeout(20_000)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))

    def on_response(r: Any) -> None:
        if PLUGIN_PATH in r.url and r.status >= 400:
            errors.append(f"{r.status} {r.url}")

    page.on("response", on_response)
    try:
        page.goto(tensorboard.url + "#nanscope")
        frame = _nanscope_frame(page)
        frame.wait_for_selector("body[data-ready='1']")
        options = frame.eval_on_selector_all("#run-select option", "els => els.map(e => e.value)")
        assert sorted(options) == ["tf", "torch"]

        frame.select_option("#run-select", "torch")
        frame.wait_for_function(
            "() => (document.querySelector('#rootcause') || {}).textContent"
            "?.includes('aten.log.default')"
        )
        assert "aten.log.default" in (frame.text_content("#rootcause .rc-headline") or "")

        # Another run: TensorFlow's dump, whose root cause is its graph's Log op.
        frame.select_option("#run-select", "tf")
        frame.wait_for_function(
            "() => !document.querySelector('#rootcause').textContent.includes('aten.log')"
            " && document.querySelector('#rootcause .rc-headline') !== null"
        )
        assert re.search(r"\bLog\b", frame.text_content("#rootcause") or "")
        assert "run=tf" in frame.url

        frame.select_option("#run-select", "torch")
        frame.wait_for_function(
            "() => document.querySelector('#rootcause').textContent.includes('aten.log.default')"
        )
        frame.wait_for_selector("body[data-pending='0']", state="attached")
        page.mouse.move(0, 0)
        path = images / "gui_tensorboard.png"
        page.screenshot(path=str(path))
        assert path.stat().st_size > 2000
    finally:
        ctx.close()
    assert not outside, f"requests beyond 127.0.0.1: {outside}"
    nanscope_errors = [e for e in errors if not e.startswith("/") or e.startswith(PLUGIN_PATH)]
    assert not nanscope_errors, nanscope_errors
