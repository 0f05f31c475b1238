"""The session core: the Realtime state machine behind one client, with no I/O of its own.

A transport hands it client messages and media; it puts server events in its outbox and, for
media transports, answer audio in its playout. Nothing here opens a socket or knows which
transport it serves; pipelines are reached only through ``pipelines.base.PipelineSession``.

    session.py       Session: its parts composed, the dispatcher, session.update, the end
    context.py       SessionContext: what every part shares (settings, lifecycle, events out)
    turn_taking.py   TurnTaking: input audio -> turns, barge-in, commits and clears
    user_input.py    UserInput: the input buffer, the open turn, user items committed
    responses.py     Responses: starting, cancelling and cutting responses
    idle.py          IdleTimeout: prompting a silent user after an answer
    items.py         Items: conversation items and their client events
    transcription.py Transcriber: input transcription and live captions
    run.py           ResponseRun: one response, from the pipeline's chunks to the event envelope
    draft.py         MessageDraft: the message a run writes, and what of it the client got
    audio_out.py     EventAudio / PacedAudio: where a run's audio goes
    config.py        SessionConfig: the effective session, session.update and response params folded
    conversation.py  the items, their wire form, and what of an answer was heard
    mcp.py           MCP tools run by the server: the allow-list, a session's servers, MCP items
    tool_servers.py  the port to an MCP server (its client, the MCP SDK, is host/mcp_client.py)
    turns.py         TurnDetector: voice activity -> speech started / paused / stopped
    input_buffer.py  the input audio buffer (bounded)
    outbox.py        the bounded queue of events waiting for the transport
    playout.py       paced answer audio for media transports
    captions.py      live captions: what to show of successive transcription passes
"""

from .config import SessionConfig
from .session import Media, Session

__all__ = ["Media", "Session", "SessionConfig"]
