"""Redis Streams: `RedisStreamSource(url, streams)` and `RedisStreamSink(url, stream)` (redis-py's asyncio
client: `pip install 'clasp[redis]'`).

The source has one partition per stream; a position is the id of the last entry read ("0-0" before the
first), values are the entries' fields as dicts of str. The sink stages each partition's writes in a Redis
list (`clasp:{STREAM}:stage:PARTITION:...`) and commits a checkpoint in one script (`COMMIT`, run by the
server: atomic) that adds the staged entries to the stream and sets the partition's marker
(`clasp:{STREAM}:committed:PARTITION`) to the checkpoint: a commit that finds the marker at or past its
checkpoint does nothing, so a replayed commit never adds twice (exactly once). The entries never travel
back to the worker: a commit is one round trip whatever its size (a MULTI/EXEC of one XADD per entry cost
the worker ~150 us per entry, seconds per checkpoint, and a recovery waits for the commits it owes). Keys
carry the stream in braces, so on a Redis Cluster they share the stream's slot and one script covers them.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import msgpack

from clasp.core.connector import Sink, SinkPartition, Source, SourcePartition

try:
    import redis.asyncio as aioredis
    from redis.exceptions import ResponseError, WatchError
except ImportError as e:  # the optional extra
    raise ImportError("clasp.connectors.redis needs redis-py: pip install 'clasp[redis]'") from e

START = "0-0"

# KEYS: the marker, the staged list, the stream; ARGV: the checkpoint, MAXLEN ('' for none). A staged row is
# a msgpack array field, value, field, value... (a map in rows staged before: both read). Every row is read
# before the first XADD: a script's writes are not undone when it fails, so a row it cannot read fails the
# commit with nothing added (and the commit in a transaction, `_commit_in_transaction`, is tried instead).
# Returns the number of entries added, -1 when the marker says the checkpoint is committed already.
COMMIT = """
local done = redis.call('GET', KEYS[1])
if done and tonumber(done) >= tonumber(ARGV[1]) then return -1 end
local rows = redis.call('LRANGE', KEYS[2], 0, -1)
local entries = {}
for i, row in ipairs(rows) do
  local fields, flat = cmsgpack.unpack(row), {}
  if fields[1] ~= nil then
    flat = fields
  else
    for k, v in pairs(fields) do flat[#flat + 1] = k; flat[#flat + 1] = v end
  end
  if #flat == 0 or #flat % 2 == 1 then return redis.error_reply('staged row ' .. i .. ' has no fields') end
  entries[i] = flat
end
for _, flat in ipairs(entries) do
  if ARGV[2] == '' then
    redis.call('XADD', KEYS[3], '*', unpack(flat))
  else
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*', unpack(flat))
  end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
return #rows
"""


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class RedisStreamPartition(SourcePartition):
    def __init__(self, url: str, stream: str, position: str | None, until_end: bool):
        self.client = aioredis.from_url(url, decode_responses=True)
        self.stream = stream
        self.last = position or START
        self.until_end = until_end
        self.end: str | None = None  # the stream's last entry when a bounded reader first looked
        self._exhausted = False

    async def next_batch(self, limit: int) -> list:
        if self._exhausted:
            return []
        if self.until_end and self.end is None:
            info = await self.client.xrevrange(self.stream, count=1)
            self.end = info[0][0] if info else START
        got = await self.client.xread({self.stream: self.last}, count=limit)
        entries = got[0][1] if got else []
        if entries:
            self.last = entries[-1][0]
        if self.until_end and (not entries or _id(self.last) >= _id(self.end)):
            self._exhausted = _id(self.last) >= _id(self.end)
        return [dict(fields) for _, fields in entries]

    def position(self) -> str:
        return self.last

    @property
    def exhausted(self) -> bool:
        return self._exhausted

    async def close(self) -> None:
        await self.client.aclose()


class RedisStreamSource(Source):
    """Entries of Redis streams (`streams`: one name or a list), one partition per stream. Unbounded by
    default; `until_end=True` reads each stream up to the last entry it held when its reader started."""

    def __init__(self, url: str, streams: str | list[str], *, until_end: bool = False):
        self.url = url
        self.streams = [streams] if isinstance(streams, str) else list(streams)
        self.until_end = until_end

    def partitions(self) -> list[str]:
        return list(self.streams)

    def open(self, partition: str, position: Any | None) -> SourcePartition:
        if partition not in self.streams:
            raise KeyError(f"RedisStreamSource has no stream {partition!r}")
        return RedisStreamPartition(self.url, partition, position, self.until_end)

    @property
    def bounded(self) -> bool:
        return self.until_end

    def __repr__(self) -> str:
        return f"RedisStreamSource({self.url!r}, {self.streams!r})"


def as_fields(value) -> dict:
    """A value as a stream entry's fields: a dict's items (values as str unless bytes), anything else as one
    field `value` (a str or bytes as it is, other values as JSON)."""
    if isinstance(value, dict):
        return {str(k): v if isinstance(v, (str, bytes)) else (json.dumps(v) if not isinstance(v, (int, float))
                                                               else str(v)) for k, v in value.items()}
    if isinstance(value, (str, bytes)):
        return {"value": value}
    return {"value": json.dumps(value)}


class RedisSinkPartition(SinkPartition):
    def __init__(self, url: str, stream: str, partition: str, maxlen: int | None):
        self.client = aioredis.from_url(url)
        self.stream = stream
        self.partition = partition
        self.maxlen = maxlen
        self.marker = f"clasp:{{{stream}}}:committed:{partition}"
        self.prefix = f"clasp:{{{stream}}}:stage:{partition}:"
        self.token = uuid.uuid4().hex[:12]  # this writer's: a restarted worker's never adds to an old list
        self.stage_no = 0
        self.staged = 0

    def _stage_key(self) -> str:
        return f"{self.prefix}{self.token}.{self.stage_no}"

    async def write_batch(self, values: list) -> None:
        # Field, value, ... as one array, str and bytes alike as msgpack raw: what the server's cmsgpack reads.
        rows = [msgpack.packb([x for kv in as_fields(v).items() for x in kv], use_bin_type=False) for v in values]
        if rows:
            await self.client.rpush(self._stage_key(), *rows)
            self.staged += len(rows)

    async def prepare(self, checkpoint: int) -> Any:
        if not self.staged:
            return None
        # The list is in Redis already: as durable as the server keeps it. A new list for what comes next.
        key, self.staged = self._stage_key(), 0
        self.stage_no += 1
        await self.client.rename(key, f"{self.prefix}ckpt-{checkpoint}")
        return {"key": f"{self.prefix}ckpt-{checkpoint}"}

    async def commit(self, checkpoint: int, prepared: Any) -> None:
        if not prepared:
            return
        try:
            await self.client.eval(COMMIT, 3, self.marker, prepared["key"], self.stream, checkpoint,
                                   "" if self.maxlen is None else self.maxlen)
        except ResponseError:  # no scripting on this server, or rows it cannot read: nothing was added
            await self._commit_in_transaction(checkpoint, prepared)

    async def _commit_in_transaction(self, checkpoint: int, prepared: Any) -> None:
        """The commit without a script: the staged entries read here and added in one MULTI/EXEC, under WATCH
        of the marker (a commit that got there first is seen)."""
        async with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(self.marker, prepared["key"])
                    done = await pipe.get(self.marker)
                    if done is not None and int(done) >= checkpoint:
                        await pipe.reset()
                        return
                    rows = await pipe.lrange(prepared["key"], 0, -1)
                    pipe.multi()
                    for row in rows:
                        fields = msgpack.unpackb(row, raw=True)
                        if isinstance(fields, list):
                            fields = dict(zip(fields[::2], fields[1::2], strict=True))
                        if self.maxlen is None:
                            pipe.xadd(self.stream, fields)
                        else:
                            pipe.xadd(self.stream, fields, maxlen=self.maxlen, approximate=True)
                    pipe.set(self.marker, checkpoint)
                    pipe.delete(prepared["key"])
                    await pipe.execute()
                    return
                except WatchError:  # another commit of this partition got there first: look again
                    continue

    async def abort(self) -> None:
        self.staged = 0
        keys = [k async for k in self.client.scan_iter(match=f"{_escape(self.prefix)}*", count=1000)]
        if keys:
            await self.client.delete(*keys)

    async def close(self) -> None:
        await self.client.aclose()


def _escape(pattern: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in pattern)


class RedisStreamSink(Sink):
    """Values appended to the Redis stream `stream` when the checkpoint that holds them completes, exactly once
    (`as_fields`: a dict's items are the entry's fields; any other value is one field `value`). `maxlen`
    trims the stream approximately (XADD MAXLEN ~)."""

    exactly_once = True

    def __init__(self, url: str, stream: str, *, maxlen: int | None = None):
        self.url = url
        self.stream = stream
        self.maxlen = maxlen

    def open(self, partition: str) -> SinkPartition:
        return RedisSinkPartition(self.url, self.stream, partition, self.maxlen)

    def __repr__(self) -> str:
        return f"RedisStreamSink({self.url!r}, {self.stream!r})"
