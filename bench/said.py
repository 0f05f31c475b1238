"""What was said, read for scoring: lower case, words only, number words as digits. The answers
bench and the tools bench score with it alike."""

from __future__ import annotations

import re

NUMBERS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13", "twenty": "20",
    "hundred": "100", "one hundred": "100", "a hundred": "100",
}  # fmt: skip


def normalise(text: str) -> str:
    """Lower case, words only, number words as digits ("four" and "4" both become "4")."""
    text = re.sub(r"[^a-z0-9 ]+", " ", text.lower())
    for word in sorted(NUMBERS, key=len, reverse=True):
        text = re.sub(rf"\b{word}\b", NUMBERS[word], text)
    return " ".join(text.split())
