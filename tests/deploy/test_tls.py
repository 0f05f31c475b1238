"""nginx terminating TLS in front of one server, with the project's own deploy/nginx-tls.conf (its
ports, upstream and certificate paths replaced) and a self-signed certificate made here with the
``openssl`` command docs/production.md gives: a Realtime session through it over wss:// with the
official SDK, WebRTC signalling over https, plain HTTP sent on to https, and a client that does not
trust the certificate refused."""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import synthetic_config
from tests.support.client import connect
from tests.support.peers import RtcClient
from tests.support.processes import free_port, nginx_site, server_process

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]

SITE = Path(__file__).parents[2] / "deploy" / "nginx-tls.conf"
API_KEY = "sk-tls"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, as docs/production.md makes one."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365", "-keyout", str(key), "-out", str(cert),
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def site(upstream: int, http_port: int, https_port: int, cert: Path, key: Path, webroot: Path) -> str:
    """deploy/nginx-tls.conf on these ports, in front of the server on ``upstream``, with this certificate
    and this folder as certbot's webroot."""
    text = SITE.read_text()
    for pattern, new in [
        (r"server 127\.0\.0\.1:8000;", f"server 127.0.0.1:{upstream};"),
        (r"listen 80;", f"listen 127.0.0.1:{http_port};"),
        (r"listen 443 ssl;", f"listen 127.0.0.1:{https_port} ssl;"),
        (r"ssl_certificate +\S+;", f"ssl_certificate {cert};"),
        (r"ssl_certificate_key +\S+;", f"ssl_certificate_key {key};"),
        (r"root /var/www/html;", f"root {webroot};"),
    ]:
        text, n = re.subn(pattern, new, text)
        assert n == 1, f"deploy/nginx-tls.conf: {pattern!r} found {n} times, not once"
    return text


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, Path]]:
    """(nginx's http port, its https port, the certificate) in front of a synthetic server."""
    # scripts/test installs both: missing, the setup is broken (a failure, not a skip)
    assert NGINX is not None and shutil.which("openssl") is not None, "needs nginx and openssl (scripts/test installs them)"
    cert, key = self_signed(tmp_path_factory.mktemp("tls"))
    # nginx's workers (not root) read the webroot: a folder of its own under /tmp, readable by all
    # (pytest's tmp_path is its owner's only)
    webroot = Path(tempfile.mkdtemp(prefix="acme-webroot-"))
    (webroot / ".well-known" / "acme-challenge").mkdir(parents=True)
    (webroot / ".well-known" / "acme-challenge" / "tok3n").write_text("tok3n.thumbprint")
    for folder in (webroot, webroot / ".well-known", webroot / ".well-known" / "acme-challenge"):
        folder.chmod(0o755)
    (webroot / ".well-known" / "acme-challenge" / "tok3n").chmod(0o644)
    config = synthetic_config(server={"api_key": API_KEY, "webrtc": {"host_addresses": ["127.0.0.1"]}})
    try:
        with server_process(config, startup_s=120) as url:
            upstream = int(url.split(":")[2].split("/")[0])
            http_port, https_port = free_port(), free_port()
            with nginx_site(site(upstream, http_port, https_port, cert, key, webroot), [http_port, https_port]):
                yield http_port, https_port, cert
    finally:
        shutil.rmtree(webroot, ignore_errors=True)


async def test_a_realtime_session_through_nginx_over_wss(proxied):
    _, https_port, cert = proxied
    trust = ssl.create_default_context(cafile=str(cert))
    async with connect(f"wss://localhost:{https_port}/v1", api_key=API_KEY, websocket_connection_options={"ssl": trust}) as c:
        await c.expect("session.created")
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}})
        await c.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        done = await c.expect("response.done")
        assert done.response.status == "completed"
        assert done.response.output[0].content[0].text == "You said Hello."


async def test_webrtc_signalling_over_https_and_media_straight_to_the_server(proxied):
    _, https_port, cert = proxied
    client = RtcClient(f"https://127.0.0.1:{https_port}", api_key=API_KEY, verify=ssl.create_default_context(cafile=str(cert)))
    try:
        await client.connect()  # the SDP offer through nginx; ICE to the server's own UDP ports
        assert client.call_id.startswith("rtc_")
        assert (await client.next("session.created"))["type"] == "session.created"
    finally:
        await client.close()


async def test_plain_http_is_sent_on_to_https_and_an_untrusted_certificate_refused(proxied):
    http_port, https_port, cert = proxied
    async with httpx.AsyncClient() as http:
        moved = await http.get(f"http://127.0.0.1:{http_port}/healthz?x=1")
        assert moved.status_code == 301 and moved.headers["location"] == "https://127.0.0.1/healthz?x=1"
        # certbot --webroot's challenge is served on port 80, not redirected (docs/production.md)
        challenge = await http.get(f"http://127.0.0.1:{http_port}/.well-known/acme-challenge/tok3n")
        assert challenge.status_code == 200 and challenge.text == "tok3n.thumbprint"
        with pytest.raises(httpx.ConnectError):  # the system's trust does not include a self-signed certificate
            await http.get(f"https://127.0.0.1:{https_port}/healthz")
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(cert))) as https:
        health = await https.get(f"https://127.0.0.1:{https_port}/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok"
