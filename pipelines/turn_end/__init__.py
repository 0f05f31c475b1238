"""The end of a user's turn: the models and rules that say whether a pause ends it.

- ``smart_turn.py``: Smart Turn v3.2, the end-of-turn model on the turn's sound (``TurnModel``);
- ``judgement.py``: how the thinker's next-token distribution is read as "do the words end the
  message?" (the cascade's thinker makes that judgement; see ``Hearing``);
- ``text_rule.py``: what a transcript's last words say, when no judgement was made;
- ``fusion.py``: the sound, the words and the silence weighed into one verdict, and the further
  silence a verdict below the threshold waits (``wait_s``);
- ``odds.py``: the one ``logit`` and ``sigmoid`` they share;
- ``policy.py``: ``TurnEndPolicy``, the one place that says when a turn ends (the session asks it).

Nothing here imports a pipeline: the session asks, a pipeline's hearing answers.
"""
