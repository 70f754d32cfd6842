"""The batch file format: parsing request lines, shaping output lines, resuming.

Input, one JSON object per line: `{"custom_id", "method": "POST", "url", "body"}`.
Output, one line per input line, in input order:
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}` where
`body` is exactly what the server answers on success (and null on failure) and `error` is
the server's error object `{"message", "type", "param", "code"}` (null on success).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from vllm.entrypoints.openai.errors import error_body
from vllm.entrypoints.openai.serving_engine import random_hex

# The routes a batch line may name (upstream's pooling endpoints).
BATCH_URLS = ("/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank",
              "/v1/rerank")


@dataclass
class BatchLine:
    """One input line: its position, custom_id and either a request or why it is refused."""

    index: int
    custom_id: Optional[str]
    url: str = ""
    body: Any = None
    error: Optional[str] = None  # set when the line itself is unusable


def parse_line(index: int, raw: str) -> BatchLine:
    """Parse one input line; a malformed one keeps its error for its output line."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        return BatchLine(index, None, error=f"Line {index + 1} is not valid JSON: {exc.msg}.")
    if not isinstance(obj, dict):
        return BatchLine(index, None, error=f"Line {index + 1} must be a JSON object with "
                         "custom_id, method, url and body.")
    custom_id = obj.get("custom_id")
    custom_id = None if custom_id is None else str(custom_id)
    line = BatchLine(index, custom_id, str(obj.get("url", "")), obj.get("body"))
    missing = [k for k in ("custom_id", "url", "body") if obj.get(k) is None]
    if missing:
        line.error = f"Line {index + 1} lacks {', '.join(missing)}."
    elif str(obj.get("method", "POST")).upper() != "POST":
        line.error = f"Method {obj.get('method')!r} is not supported; batch requests are POST."
    elif line.url not in BATCH_URLS:
        line.error = (f"URL {line.url} was used. Supported endpoints: "
                      f"{', '.join(BATCH_URLS)}.")
    elif not isinstance(line.body, dict):
        line.error = "The body must be a JSON object."
    return line


def output_line(custom_id: Optional[str], status: int, body: Any) -> dict[str, Any]:
    """The output record for one answered (or refused) line."""
    ok = status == 200
    error = None if ok else (body.get("error") if isinstance(body, dict) and "error" in body
                             else error_body(status, str(body))["error"])
    return {"id": f"vllm-{random_hex()}", "custom_id": custom_id,
            "response": {"status_code": status, "request_id": f"vllm-batch-{random_hex()}",
                         "body": body if ok else None},
            "error": error}


def refused_line(line: BatchLine) -> dict[str, Any]:
    return output_line(line.custom_id, 400, error_body(400, line.error or "Invalid line."))


def read_lines(path: str) -> Iterator[str]:
    """Non-blank lines of a local file."""
    with open(path, encoding="utf-8") as f:
        for raw in f:
            if raw.strip():
                yield raw


def resume_state(path: str) -> tuple[set[str], int]:
    """The custom_ids already written to `path` and the number of complete lines. A last
    line cut short (a job killed mid-write) is removed so that the file stays valid JSONL."""
    if not os.path.exists(path):
        return set(), 0
    done: set[str] = set()
    count = 0
    keep = 0
    with open(path, "rb") as f:
        for raw in f:
            try:
                record = json.loads(raw) if raw.endswith(b"\n") else None
            except json.JSONDecodeError:
                record = None
            if not isinstance(record, dict):
                break
            keep += len(raw)
            count += 1
            if record.get("custom_id") is not None:
                done.add(str(record["custom_id"]))
    if keep != os.path.getsize(path):
        with open(path, "r+b") as f:
            f.truncate(keep)
    return done, count


def pending_lines(path: str, done: set[str], written: int) -> list[BatchLine]:
    """The input lines still to run: a line is skipped when its custom_id was written; a
    line without one (bad JSON) when it lies within the first `written` lines."""
    lines = [parse_line(i, raw) for i, raw in enumerate(read_lines(path))]
    return [ln for ln in lines
            if not (ln.custom_id in done if ln.custom_id is not None else ln.index < written)]


class OrderedWriter:
    """Appends output records as JSON lines, flushed line by line (so a resume sees them)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.write_raw(json.dumps(record, separators=(",", ":")))

    def write_raw(self, line: str) -> None:
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
