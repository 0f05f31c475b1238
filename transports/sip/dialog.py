"""SIP dialogs (RFC 3261 12): our side of a call's dialog, and the requests we send in it.

A dialog is made from the INVITE that opened the call (12.1.1): its Call-ID, the caller's tag and
ours, the URIs the two ends go by, the caller's Contact (the target of our requests) and the
Record-Route set. In-dialog requests from the caller must match Call-ID and both tags (12.2.2);
ours carry the next local CSeq, the route set and a fresh branch (12.2.1.1), and go to the first
route's address when a proxy record-routed the call (a balancer in front of several replicas), else
where the caller's requests come from. No I/O here.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from .message import Addr, SipMessage, param, token, uri_of

USER_AGENT = "realtime-omni"


@dataclass
class Dialog:
    """Our side of a call's dialog (RFC 3261 12): what in-dialog requests we send must carry."""

    call_id: str
    local_tag: str
    remote_tag: str
    local_uri: str  # the To of the INVITE: becomes our From
    remote_uri: str  # the From of the INVITE: becomes our To
    remote_target: str  # the caller's Contact: the Request-URI of our requests
    route: list[str]
    addr: Addr  # where the caller's signalling comes from
    local_cseq: int = 1
    confirmed: bool = False  # ACK received

    def matches(self, msg: SipMessage) -> bool:
        """Whether the caller's in-dialog request ``msg`` belongs to this dialog (12.2.2)."""
        return (
            msg.call_id == self.call_id
            and param(msg.get("To") or "", "tag") == self.local_tag
            and param(msg.get("From") or "", "tag") == self.remote_tag
        )

    @property
    def next_hop(self) -> Addr:
        """Where our requests in this dialog go. With a route set whose first entry is a loose
        router (``;lr``, RFC 3261 12.2.1.1 and 8.1.2), that entry's address: the proxy that
        record-routed the call, which may listen at another address than the one it sent the
        INVITE from. Without one, when its host is a name (no lookup blocks the event loop here) or
        an address of the other IP family than our socket's, where the caller's requests come from."""
        if self.route:
            first = uri_of(self.route[0])
            hop = _sip_uri_addr(first)
            loose = any(p.strip().lower().split("=")[0] == "lr" for p in first.split(";")[1:])
            if hop is not None and loose and (":" in hop[0]) == (":" in self.addr[0]):
                return hop
        return self.addr

    def request(self, method: str, host: str, port: int, extra: list[tuple[str, str]] | None = None, body: bytes = b"") -> SipMessage:
        """Our next request in this dialog; ``host:port`` is where we take its responses."""
        self.local_cseq += 1
        branch = "z9hG4bK" + token(16)
        headers = [
            ("Via", f"SIP/2.0/UDP {host}:{port};branch={branch};rport"),
            ("Max-Forwards", "70"),
            ("From", f"<{self.local_uri}>;tag={self.local_tag}"),
            ("To", f"<{self.remote_uri}>;tag={self.remote_tag}"),
            ("Call-ID", self.call_id),
            ("CSeq", f"{self.local_cseq} {method}"),
            *[("Route", r) for r in self.route],
            ("Contact", f"<sip:{USER_AGENT}@{host}:{port}>"),
            ("User-Agent", USER_AGENT),
            *(extra or []),
        ]
        return SipMessage(method=method, uri=self.remote_target, headers=headers, body=body)


def _sip_uri_addr(uri: str) -> Addr | None:
    """The (IP literal, port) of a ``sip:`` URI, None when its host is a name or it is not one."""
    scheme, _, rest = uri.partition(":")
    if scheme.lower() not in ("sip", "sips"):
        return None
    hostport = rest.split(";")[0].split("?")[0].rpartition("@")[2]
    if hostport.startswith("["):  # [v6]:port
        host, _, tail = hostport[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port = hostport.partition(":")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    if port and not port.isdigit():
        return None
    return host, int(port) if port else (5061 if scheme.lower() == "sips" else 5060)


def dialog_for(msg: SipMessage, local_tag: str, addr: Addr) -> Dialog:
    """The dialog a dialog-creating INVITE ``msg`` from ``addr`` opens, with our tag ``local_tag``."""
    contact = msg.get("Contact")
    return Dialog(
        call_id=msg.call_id,
        local_tag=local_tag,
        remote_tag=param(msg.get("From") or "", "tag") or "",
        local_uri=uri_of(msg.get("To") or ""),
        remote_uri=uri_of(msg.get("From") or ""),
        remote_target=uri_of(contact) if contact else uri_of(msg.get("From") or ""),
        route=msg.get_all("Record-Route"),
        addr=addr,
    )
