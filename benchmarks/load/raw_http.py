"""A minimal HTTP/1.1 keep-alive client on asyncio streams, for the load generator of ``coordinator_load.py``.

Why not httpx: measured in the 1000-worker run, the fleet's httpx client cost ~0.5 cores for ~50 calls/s plus ~70
uploads/s, and together with the S3 server it saturated the generator's core (event-loop lag p99 0.7 s), so the
latencies measured the generator. This client does one thing — send a request with a ``Content-Length`` body and
read a ``Content-Length`` or chunked answer over a pooled connection — for a small fraction of that CPU.
It never follows redirects, speaks only plain http (loopback), closes a connection after any error, and resends a
request once on a new connection when the server closed a reused one before answering (as httpx does).
"""

from __future__ import annotations

import asyncio
import collections
import time
from urllib.parse import urlsplit

IDLE_S = 3.0  # reuse a pooled connection only this long after its last answer


class RawHTTP:
    """``await client.request(method, url, body, headers) -> (status, body)`` with at most ``limit`` requests in
    flight and idle connections reused per (host, port)."""

    def __init__(self, limit: int = 512, timeout: float = 120.0):
        self.idle: dict[tuple[str, int], list] = collections.defaultdict(list)
        self.sem = asyncio.Semaphore(limit)
        self.timeout = timeout

    async def request(self, method: str, url: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, bytes]:
        parts = urlsplit(url)
        if parts.scheme != "http":
            raise ValueError(f"RawHTTP speaks plain http only, not {url!r}")
        key = (parts.hostname, parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = [f"{method} {target} HTTP/1.1", f"Host: {key[0]}:{key[1]}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        payload = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        async with self.sem:
            return await asyncio.wait_for(self._exchange(key, payload, body), self.timeout)

    async def _connection(self, key: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        """A pooled connection used less than ``IDLE_S`` ago (servers close idle ones: uvicorn after 5 s), or a new
        one; the flag says whether it was reused."""
        pool, now = self.idle[key], time.monotonic()
        while pool:
            reader, writer, used = pool.pop()
            if now - used < IDLE_S and not reader.at_eof():
                return reader, writer, True
            writer.close()
        return (*await asyncio.open_connection(*key), False)

    async def _exchange(self, key: tuple[str, int], payload: bytes, body: bytes) -> tuple[int, bytes]:
        reader, writer, reused = await self._connection(key)
        try:
            writer.write(payload)
            if body:
                writer.write(body)
            await writer.drain()
            try:
                status, length, chunked, close = await _read_head(reader)
            except (ConnectionError, asyncio.IncompleteReadError):
                if not reused:
                    raise
                writer.close()  # the server closed a reused connection before answering: once more on a new one
                reader, writer = await asyncio.open_connection(*key)
                writer.write(payload)
                if body:
                    writer.write(body)
                await writer.drain()
                status, length, chunked, close = await _read_head(reader)
            data = await _read_chunked(reader) if chunked else (await reader.readexactly(length) if length else b"")
        except BaseException:
            writer.close()
            raise
        if close:
            writer.close()
        else:
            self.idle[key].append((reader, writer, time.monotonic()))
        return status, data

    async def aclose(self) -> None:
        for pool in self.idle.values():
            for _, writer, _ in pool:
                writer.close()
        self.idle.clear()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, int, bool, bool]:
    """(status, content length, chunked, connection: close) of one response head."""
    line = await reader.readline()
    if not line:
        raise ConnectionError("the server closed the connection")
    status = int(line.split()[1])
    length, chunked, close = 0, False, False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return status, length, chunked, close
        name, _, value = line.decode("latin-1").partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding":
            chunked = "chunked" in value
        elif name == "connection":
            close = value == "close"


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readexactly(2)  # CRLF after each chunk
