"""The disk cache of LLM calls: exact keys, round trips, atomic writes."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from coevo.meta.cache import CachedCall, CallCache, call_key

MESSAGES = [{"role": "system", "content": "plan"}, {"role": "user", "content": "digest ..."}]
SCHEMA = {"type": "object", "properties": {"proposals": {"type": "array"}}}


def test_key_is_sha256_of_the_canonical_inputs():
    payload = '{"messages":[{"content":"plan","role":"system"},{"content":"digest ...","role":"user"}],' \
              '"model":"m","schema":{"properties":{"proposals":{"type":"array"}},"type":"object"},"stage":"plan"}'
    assert call_key("m", "plan", MESSAGES, SCHEMA) == hashlib.sha256(payload.encode()).hexdigest()
    reordered = {"properties": {"proposals": {"type": "array"}}, "type": "object"}
    assert call_key("m", "plan", MESSAGES, reordered) == call_key("m", "plan", MESSAGES, SCHEMA)


def test_round_trip_and_every_input_is_part_of_the_key(tmp_path):
    cache = CallCache(tmp_path / "calls")
    assert cache.get("m", "plan", MESSAGES, SCHEMA) is None
    path = cache.put("m", "plan", MESSAGES, SCHEMA, '{"proposals": []}', 120, 8)
    key = call_key("m", "plan", MESSAGES, SCHEMA)
    assert path == tmp_path / "calls" / key[:2] / f"{key}.json"
    assert cache.get("m", "plan", MESSAGES, SCHEMA) == CachedCall('{"proposals": []}', 120, 8)
    assert CallCache(tmp_path / "calls").get("m", "plan", MESSAGES, SCHEMA) == CachedCall('{"proposals": []}', 120, 8)
    other = [{"role": "user", "content": "digest !!!"}]
    assert cache.get("m2", "plan", MESSAGES, SCHEMA) is None
    assert cache.get("m", "revise", MESSAGES, SCHEMA) is None
    assert cache.get("m", "plan", other, SCHEMA) is None
    assert cache.get("m", "plan", MESSAGES, {"type": "object"}) is None
    assert json.loads(path.read_text()) == {"key": key, "model": "m", "stage": "plan", "text": '{"proposals": []}',
                                            "prompt_tokens": 120, "completion_tokens": 8}


def test_writes_leave_no_temporary_files_and_overwrite_atomically(tmp_path):
    cache = CallCache(tmp_path)
    cache.put("m", "plan", MESSAGES, SCHEMA, "first", 1, 1)
    cache.put("m", "plan", MESSAGES, SCHEMA, "second", 2, 2)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 1 and cache.get("m", "plan", MESSAGES, SCHEMA).text == "second"


def test_a_failed_write_keeps_the_old_entry_and_cleans_up(tmp_path, monkeypatch):
    cache = CallCache(tmp_path)
    cache.put("m", "plan", MESSAGES, SCHEMA, "old", 1, 1)

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        cache.put("m", "plan", MESSAGES, SCHEMA, "new", 2, 2)
    assert cache.get("m", "plan", MESSAGES, SCHEMA) == CachedCall("old", 1, 1)
    assert len([p for p in tmp_path.rglob("*") if p.is_file()]) == 1


def test_an_unreadable_entry_is_a_miss(tmp_path):
    cache = CallCache(tmp_path)
    path = cache.put("m", "plan", MESSAGES, SCHEMA, "x", 1, 1)
    path.write_text("{not json")
    assert cache.get("m", "plan", MESSAGES, SCHEMA) is None
    path.write_text('{"text": "x"}')
    assert cache.get("m", "plan", MESSAGES, SCHEMA) is None
    assert repr(cache) == f"CallCache({str(tmp_path)!r})"
