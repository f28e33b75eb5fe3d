"""Stand-ins for the rendezvous store in cluster tests that need no real processes."""

from __future__ import annotations


class JoinedStore:
    """The store reads the roster makes, for a job where the nodes in `joined` (rank -> what the
    node posted when it joined) joined and nothing else happened yet."""

    def __init__(self, joined: dict[int, dict]):
        self.joined = joined
        self.store = self

    def logged(self, name: str) -> set[int]:
        return set(self.joined) if name == "joined" else set()

    def get(self, key: str):
        kind, rank = key.split("/")
        return self.joined[int(rank)] if kind == "joined" else None

    def counters(self, keys: list[str]) -> list[int]:
        return [1] * len(keys)

    def check(self, keys: list[str]) -> bool:
        return False
