"""Fixtures the SIP test modules share: the application's webhook, and a bare caller for a
module's ``bridge`` (a server with a SIP bridge)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.server import ServerThread
from tests.support.sip import RawUac, WebhookReceiver


@pytest.fixture(scope="module")
def webhook() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    yield receiver
    receiver.close()


@pytest.fixture()
def uac(bridge: ServerThread) -> Iterator[RawUac]:
    client = RawUac(tuple(bridge.app.state.sip.address))
    yield client
    client.close()
