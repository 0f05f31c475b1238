"""realtime-omni: a real-time voice agent server speaking the OpenAI Realtime API."""

__version__ = "0.1.0"
