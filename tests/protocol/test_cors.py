"""CORS on the HTTP API, over real sockets: what a browser on another origin is told by a server
whose ``allowed_origins`` names it, admits it by ``"*"``, does not list it, or is not set."""

from __future__ import annotations

import httpx

from tests.conftest import synthetic_config
from tests.support.peers import offer_sdp
from tests.support.server import ServerThread

KEY = "sekrit"
APP = "https://app.example"
EVIL = "https://evil.example"


def cors_headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k.startswith("access-control-")}


def preflight(http: httpx.AsyncClient, path: str, origin: str, method: str = "POST"):
    headers = {"Origin": origin, "Access-Control-Request-Method": method, "Access-Control-Request-Headers": "authorization,content-type,openai-beta"}
    return http.options(path, headers=headers)


async def test_a_listed_origin_is_answered_by_name_errors_included():
    srv = ServerThread(synthetic_config(server={"api_key": KEY, "allowed_origins": [APP, "https://other.example/"]})).start()
    offer = await offer_sdp()
    try:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            for path, method in (("/v1/realtime/calls", "POST"), ("/v1/realtime/client_secrets", "POST"), ("/v1/realtime/calls/rtc_x", "DELETE"), ("/demo/config", "GET")):
                r = await preflight(http, path, APP, method)
                assert r.status_code == 204, (path, r.status_code, r.text)
                assert r.headers["access-control-allow-origin"] == APP
                assert r.headers["access-control-allow-credentials"] == "true"
                assert method in r.headers["access-control-allow-methods"]
                assert r.headers["access-control-allow-headers"] == "authorization,content-type,openai-beta"
                assert int(r.headers["access-control-max-age"]) > 0
                assert r.headers["vary"] == "Origin"
            # a listed origin written with a trailing slash matches the browser's (which has none)
            r = await preflight(http, "/v1/realtime/calls", "https://other.example")
            assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "https://other.example"

            # the page's whole path: mint a key (the backend's job, shown here with the API key), post
            # the offer with it, hang up; every answer readable by the page
            minted = await http.post("/v1/realtime/client_secrets", json={}, headers={"Origin": APP, "Authorization": f"Bearer {KEY}"})
            assert minted.status_code == 200 and minted.headers["access-control-allow-origin"] == APP
            ephemeral = minted.json()["value"]
            call = await http.post("/v1/realtime/calls", content=offer, headers={"Origin": APP, "Authorization": f"Bearer {ephemeral}", "Content-Type": "application/sdp"})
            assert call.status_code == 201, call.text
            assert call.headers["access-control-allow-origin"] == APP
            assert "Location" in call.headers["access-control-expose-headers"]  # the page reads the call's id
            assert "Origin" in call.headers["vary"]
            hangup = await http.delete(call.headers["location"], headers={"Origin": APP, "Authorization": f"Bearer {KEY}"})
            assert hangup.status_code == 200 and hangup.headers["access-control-allow-origin"] == APP

            # errors carry the headers too, so the page can read why
            spent = await http.post("/v1/realtime/calls", content=offer, headers={"Origin": APP, "Authorization": f"Bearer {ephemeral}", "Content-Type": "application/sdp"})
            assert spent.status_code == 401 and spent.json()["error"]["code"] == "invalid_api_key"
            assert spent.headers["access-control-allow-origin"] == APP
            no_key = await http.post("/v1/realtime/client_secrets", json={}, headers={"Origin": APP})
            assert no_key.status_code == 401 and no_key.headers["access-control-allow-origin"] == APP
            demo_key = await http.post("/demo/key", headers={"Origin": APP})
            assert demo_key.status_code == 403 and demo_key.headers["access-control-allow-origin"] == APP
            demo = await http.get("/demo/config", headers={"Origin": APP})
            assert demo.status_code == 200 and demo.headers["access-control-allow-origin"] == APP

            # no Origin (not a browser): no CORS headers, but the answer still varies by Origin for caches
            plain = await http.get("/demo/config")
            assert cors_headers(plain) == {} and plain.headers["vary"] == "Origin"
        assert await srv.acall(lambda: srv.server.sessions == set())
    finally:
        srv.stop()


async def test_an_origin_not_listed_gets_no_cors_headers():
    srv = ServerThread(synthetic_config(server={"api_key": KEY, "allowed_origins": [APP]})).start()
    offer = await offer_sdp()
    try:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            r = await preflight(http, "/v1/realtime/calls", EVIL)
            assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
            assert cors_headers(r) == {}
            # a look-alike is another origin: scheme, host and port are compared whole
            for other in ("http://app.example", "https://app.example:8443", "https://app.example.evil.example", "null"):
                r = await preflight(http, "/v1/realtime/client_secrets", other)
                assert r.status_code == 403 and cors_headers(r) == {}, other
            # the request itself, as a browser would send it after a refused preflight (or a simple one)
            minted = await http.post("/v1/realtime/client_secrets", json={}, headers={"Origin": EVIL, "Authorization": f"Bearer {KEY}"})
            assert cors_headers(minted) == {}  # the browser will not let the page read the key
            call = await http.post("/v1/realtime/calls", content=offer, headers={"Origin": EVIL, "Authorization": f"Bearer {KEY}", "Content-Type": "application/sdp"})
            assert call.status_code == 403 and call.json()["error"]["code"] == "origin_not_allowed"
            assert cors_headers(call) == {}
    finally:
        srv.stop()


async def test_a_wildcard_admits_any_origin_but_never_with_credentials():
    srv = ServerThread(synthetic_config(server={"api_key": KEY, "allowed_origins": ["*"]})).start()
    try:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            r = await preflight(http, "/v1/realtime/client_secrets", EVIL)
            assert r.status_code == 204
            assert r.headers["access-control-allow-origin"] == "*"
            assert "access-control-allow-credentials" not in r.headers
            refused = await http.post("/v1/realtime/client_secrets", json={}, headers={"Origin": EVIL})
            assert refused.status_code == 401
            assert refused.headers["access-control-allow-origin"] == "*"
            assert "access-control-allow-credentials" not in refused.headers
    finally:
        srv.stop()


async def test_a_wildcard_beside_names_still_gives_credentials_only_to_the_names():
    srv = ServerThread(synthetic_config(server={"allowed_origins": [APP, "*"]})).start()
    try:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            named = await http.get("/demo/config", headers={"Origin": APP})
            assert named.headers["access-control-allow-origin"] == APP and named.headers["access-control-allow-credentials"] == "true"
            anyone = await http.get("/demo/config", headers={"Origin": EVIL})
            assert anyone.headers["access-control-allow-origin"] == "*" and "access-control-allow-credentials" not in anyone.headers
            assert anyone.headers["vary"] == "Origin"  # the answer differs by origin
    finally:
        srv.stop()


async def test_without_allowed_origins_there_is_no_cors():
    srv = ServerThread(synthetic_config()).start()
    try:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            r = await preflight(http, "/v1/realtime/calls", APP)
            assert r.status_code == 405  # as before: a same-origin server answers no preflight
            assert cors_headers(r) == {}
            got = await http.get("/demo/config", headers={"Origin": APP})
            assert got.status_code == 200 and cors_headers(got) == {} and "vary" not in got.headers
    finally:
        srv.stop()
