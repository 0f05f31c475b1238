"""Tool calls of the CPU cascade's thinker, in one room.

- ``format.py``: the thinker's own call format (its chat template's tools, ``<tool_call>`` JSON),
  parsed as it streams (``CallParser``, ``ToolStream``), the schema checks, the forced calls'
  heads and grammars, the tools' names walked as a trie for the model's second choice.
- ``steering.py``: calls written by steering the engine (``CallWriter``: its ``Step`` and move
  table), values that name something copied from what was said (``Spans``).
- ``grounding.py``: whether a call's values were said (``ungrounded``), and what to say when not.

What follows an answer's calls (the counts, a value asked for again, the model's second choice,
the answer in words instead) is decided in one place, ``pipelines/cascade/call_policy.py``
(``CallPolicy``: it writes a second choice with the thinker, above this room).
"""
