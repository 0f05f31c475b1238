"""The session core: the Realtime state machine behind one client, with no I/O of its own.

A transport hands it client messages and media; it puts server events in its outbox and, for
media transports, answer audio in its playout. Nothing here opens a socket or knows which
transport it serves; pipelines are reached only through ``pipelines.base.PipelineSession``.

    session.py       Session: the dispatcher, event sending, media input, lifecycle
    run.py           ResponseRun: one response, from the pipeline's chunks to the event envelope
    config.py        SessionConfig: the effective session, session.update and response params folded
    conversation.py  the items, their wire form, and what of an answer was heard
    turns.py         TurnDetector: voice activity -> speech started / paused / stopped
    input_buffer.py  the input audio buffer (bounded)
    outbox.py        the bounded queue of events waiting for the transport
    playout.py       paced answer audio for media transports
"""

from .config import SessionConfig
from .session import Media, Session

__all__ = ["Media", "Session", "SessionConfig"]
