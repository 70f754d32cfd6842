"""Identical requests in flight are computed once.

A request whose token ids, token types, cache salt, LoRA adapter and (verified) pooling
parameters equal
those of a request already waiting or running becomes that request's *follower*: it is
never scheduled, and when the leader finishes every follower gets its own output (a copy
of the leader's, under its own id). This covers duplicates inside one request (the same
text twice in an `input` list) and across requests that meet in the engine. Aborting a
leader that still has followers only stops its own output; the computation goes on for
the followers.
"""
from __future__ import annotations

from typing import Hashable, Optional

from vllm.engine.prompt_types import TokenizedPrompt
from vllm.pooling_params import PoolingParams


def request_key(prompt: TokenizedPrompt, params: PoolingParams,
                lora_key: Optional[str] = None) -> Hashable:
    """`lora_key`: the adapter's identity (None: the base model)."""
    return (tuple(prompt.prompt_token_ids), tuple(prompt.token_type_ids or ()),
            prompt.cache_salt, prompt.prompt_len, repr(params), lora_key, prompt.mm_key)


class Deduplicator:
    def __init__(self) -> None:
        self._leader_of_key: dict[Hashable, str] = {}
        self._key_of: dict[str, Hashable] = {}
        self._followers: dict[str, list[str]] = {}
        self._follower_of: dict[str, str] = {}
        self._silenced: set[str] = set()  # aborted leaders computed only for followers

    def leader_for(self, request_id: str, key: Hashable) -> Optional[str]:
        """The running twin `request_id` follows (now recorded), or None: then
        `request_id` leads its key and must be scheduled."""
        leader = self._leader_of_key.get(key)
        if leader is not None:
            self._followers[leader].append(request_id)
            self._follower_of[request_id] = leader
            return leader
        self._leader_of_key[key] = request_id
        self._key_of[request_id] = key
        self._followers[request_id] = []
        return None

    def finish(self, leader: str) -> tuple[bool, list[str]]:
        """The leader finished: (emit its own output?, its followers' ids)."""
        followers = self._forget(leader)
        for f in followers:
            self._follower_of.pop(f, None)
        silenced = leader in self._silenced
        self._silenced.discard(leader)
        return not silenced, followers

    def abort(self, request_ids: set[str]) -> set[str]:
        """Forget aborted followers; return the ids the scheduler must really abort
        (leaders without followers left, and ids this module never saw)."""
        real = set()
        for rid in request_ids:
            leader = self._follower_of.pop(rid, None)
            if leader is not None:
                self._followers[leader].remove(rid)
                if not self._followers[leader] and leader in self._silenced:
                    real.add(leader)
                    self._silenced.discard(leader)
                    self._forget(leader)
            elif self._followers.get(rid):
                self._silenced.add(rid)
            else:
                self._forget(rid)
                real.add(rid)
        return real

    def drop(self, leaders: set[str]) -> None:
        """These leaders failed: forget them and their followers (the caller fails all)."""
        for leader in leaders:
            for f in self._forget(leader):
                self._follower_of.pop(f, None)
            self._silenced.discard(leader)

    def _forget(self, leader: str) -> list[str]:
        key = self._key_of.pop(leader, None)
        if key is not None and self._leader_of_key.get(key) == leader:
            del self._leader_of_key[key]
        return self._followers.pop(leader, [])
