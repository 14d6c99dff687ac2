#!/usr/bin/env python3
"""Checks feed-server with real WebSocket clients from the Python `websockets` library.

    Examples/clients/setup.sh
    Examples/.venv/bin/python Examples/clients/ws_check.py \\
        --servers 127.0.0.1:8080,127.0.0.1:8081 --clients 50 --messages 200 --rate 100 --slow 1 --timeout 60

Connects --clients fast clients spread over the servers (policy newest, capacity 250)
and --slow slow clients (policy newest, capacity 8, reading 10 messages a second through
a small receive buffer), waits for every client's `ready`, then publishes --messages
messages with POST /publish, alternating between the servers, one after the other at
--rate a second. Each body is a JSON object {"run": ID, "n": i, "sent": epoch ms, "pad": ...}:
the run id tells this run's messages from a replayed one of an earlier run, and the pad
(--pad bytes, incompressible) makes the slow clients outgrow the kernel's socket buffers,
so that the server's subscription policy, not TCP, has to absorb them. The fast clients'
p99 end-to-end latency (publisher's `sent` to receipt) must stay under --max-p99-ms:
a slow client must not hold the others back. Once every client has read up to the last
message and left, the servers' /stats `dropped` must have grown by exactly the sum of the
clients' last gap frames (stats-dropped-exact: each drop counted once).

With --topics N (N >= 2), a topic section follows (or runs alone with --only-topics):
once no server LISTENs on anything, clients join topic `feed` (no `topic` parameter) and
N-1 topics of this run, on every server (the last topic on the first server only), and
--topic-messages messages go round-robin to the topics (topic-less POSTs for `feed`) and
the servers. Every client must get its own topic's messages, all and in order, and none
of another topic's; each server's /stats `listeningTopics` must equal the topics of its
clients while they are connected and return to 0 (within 15 s) once they have left.
Bad topics (`Room`, `a b`, 49 characters, empty) get a 400 on both `GET /feed` (with
Upgrade headers: no upgrade; the plain GET gives the one-line reason) and `POST /publish`
(a one-line reason and `Connection: close`).

With --recovery (or --only-recovery), a recovery section: on each server, a client reads a
few messages of its own topic, leaves, --recovery-missed messages are published (alternating
servers) while an anchor client keeps the topic alive, and the client comes back with
`since=LAST&epoch=E` (the epoch from its `ready`): it must get exactly the missed messages, in
order, then `{"type":"recovered","from":LAST+1,"to":...}`, then live messages with no duplicate.
A since of another epoch, one ahead of the topic, and (first server) one that the window no longer
holds (--history-messages + 5 messages published) must get `resync`; a bad since/epoch is a 400.
With --batch-messages N, a batch section goes first: one client on a topic of its own stops
reading (4 KiB receive buffer) while N messages of 4,000 bytes are published, then reads them:
all N must arrive in order without a gap frame, written in fewer flushes than messages
(/stats `writes`), which is the pump's batched write path.

Prints `PASS name` or `FAIL name: reason` per check and `N passed, N failed` last;
exits 1 if any check failed. Every wait is bounded by --timeout (per section).
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import os
import socket
import sys
import time
import uuid

import websockets
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from checks import Checks

FAST_CAPACITY = 250
SLOW_CAPACITY = 8
SLOW_READS_PER_SECOND = 10
SLOW_RCVBUF = 4096
BAD_QUERIES = [
    "policy=Newest",
    "capacity=-1",
    "capacity=abc",
    "policy=bounded&capacity=0",
    "capacity=1000001",
]
STATS_KEYS = ["subscribers", "delivered", "dropped", "evicted", "rssBytes"]
DEFAULT_TOPIC = "feed"
BAD_TOPICS = ["Room", "a%20b", "a" * 49, ""]  # as they appear in the query string
UNLISTEN_WAIT = 15.0  # the broadcast hub UNLISTENs 5 s after a topic's last client



class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap: float | None = None) -> float:
        left = max(0.0, self.end - time.monotonic())
        return left if cap is None else min(left, cap)


def split_host(server: str) -> tuple[str, int]:
    host, _, port = server.rpartition(":")
    return host.strip("[]"), int(port)


def http_request(server: str, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
    host, port = split_host(server)
    conn = http.client.HTTPConnection(host, port, timeout=max(timeout, 0.1))
    try:
        headers = {"Content-Type": "text/plain; charset=utf-8"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class Publisher:
    """One keep-alive HTTP connection per server; POSTs run in a thread, one at a time."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes, timeout: float, path: str = "/publish") -> int:
        for attempt in range(2):
            if self.conn is None:
                host, port = split_host(self.server)
                self.conn = http.client.HTTPConnection(host, port, timeout=max(timeout, 0.1))
            try:
                self.conn.timeout = max(timeout, 0.1)
                if self.conn.sock is not None:
                    self.conn.sock.settimeout(self.conn.timeout)
                self.conn.request("POST", path, body=body,
                                  headers={"Content-Type": "text/plain; charset=utf-8"})
                response = self.conn.getresponse()
                response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self.close()
                return response.status
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                # A kept-alive connection the server closed: retry once on a new one. Safe only
                # because nothing was answered, which for these errors means nothing was read.
                self.close()
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Client:
    def __init__(self, index: int, server: str, slow: bool, run: str, last_n: int,
                 topic: str | None = None) -> None:
        self.index = index
        self.server = server
        self.slow = slow
        self.run = run
        self.last_n = last_n
        self.topic = topic  # None: no `topic` parameter (the default topic)
        self.foreign: list[str] = []  # this run's messages of another topic
        self.topic_section = False
        self.frames: list[tuple[float, dict]] = []  # (receive time, frame)
        self.ns: list[int] = []  # this run's n, in arrival order
        self.seqs: list[int] = []
        self.gaps: list[int] = []  # the `dropped` of each gap frame
        self.online: list[tuple[float, int]] = []
        self.sent_mismatch: list[str] = []
        self.latencies_ms: list[float] = []
        self.bad_frames: list[str] = []
        self.ready = asyncio.Event()
        self.done = asyncio.Event()  # this run's last message arrived
        self.drain = asyncio.Event()  # a slow client stops being slow
        self.ws = None
        self.task: asyncio.Task | None = None
        self.error: str | None = None

    @property
    def name(self) -> str:
        on_topic = f" topic {self.topic or DEFAULT_TOPIC}" if self.topic_section else ""
        return f"{'slow' if self.slow else 'fast'} client {self.index} on {self.server}{on_topic}"

    async def open(self, timeout: float) -> None:
        capacity = SLOW_CAPACITY if self.slow else FAST_CAPACITY
        topic = "" if self.topic is None else f"topic={self.topic}&"
        uri = f"ws://{self.server}/feed?{topic}policy=newest&capacity={capacity}"
        options: dict = dict(ping_interval=None, proxy=None, open_timeout=max(timeout, 0.1),
                             close_timeout=2, max_size=None)
        if self.slow:
            host, port = split_host(self.server)
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            # Before connect, so the advertised window stays small.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host, port)), max(timeout, 0.1))
            except BaseException:
                sock.close()
                raise
            options.update(sock=sock, max_queue=1, compression=None)
        self.ws = await connect(uri, **options)
        self.task = asyncio.create_task(self.read_loop())

    async def read_loop(self) -> None:
        assert self.ws is not None
        try:
            while True:
                raw = await self.ws.recv()
                now = time.time()
                try:
                    frame = json.loads(raw)
                    kind = frame["type"]
                except (ValueError, TypeError, KeyError):
                    self.bad_frames.append(str(raw)[:80])
                    continue
                self.frames.append((now, frame))
                if kind == "ready":
                    self.ready.set()
                elif kind == "message":
                    self.on_message(now, frame)
                elif kind == "gap":
                    self.gaps.append(frame.get("dropped"))
                elif kind == "online":
                    self.online.append((now, frame.get("count")))
                if self.slow and not self.drain.is_set():
                    try:
                        await asyncio.wait_for(self.drain.wait(), 1 / SLOW_READS_PER_SECOND)
                    except asyncio.TimeoutError:
                        pass
        except ConnectionClosed as closed:
            self.error = f"connection closed: {closed}"
        except Exception as error:  # noqa: BLE001 - reported as a failed check
            self.error = f"{type(error).__name__}: {error}"
        finally:
            self.ready.set()  # whoever waits for ready looks at self.error
            self.done.set()

    def on_message(self, now: float, frame: dict) -> None:
        seq = frame.get("seq")
        if isinstance(seq, int):
            self.seqs.append(seq)
        else:
            self.bad_frames.append(f"seq {seq!r}")
        body = frame.get("body")
        try:
            payload = json.loads(body) if isinstance(body, str) else None
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or payload.get("run") != self.run:
            return  # a replay of an earlier run, or someone else's message
        if "topic" in payload and payload["topic"] != (self.topic or DEFAULT_TOPIC):
            self.foreign.append(f"{payload['topic']}#{payload.get('n')}")
            return
        n = payload.get("n")
        self.ns.append(n)
        if frame.get("sent") != payload.get("sent"):
            self.sent_mismatch.append(f"n={n}: frame sent {frame.get('sent')!r}, body sent {payload.get('sent')!r}")
        elif isinstance(frame.get("sent"), (int, float)):
            self.latencies_ms.append(now * 1000 - frame["sent"])
        if n == self.last_n:
            self.done.set()

    async def close(self) -> None:
        if self.ws is not None:
            try:
                await asyncio.wait_for(self.ws.close(), 5)
            except Exception:  # noqa: BLE001 - closing at the end; the checks are done
                pass
        if self.task is not None:
            self.task.cancel()


def one_line(body: bytes) -> bool:
    text = body.decode("utf-8", "replace").strip()
    return text != "" and "\n" not in text


async def check_bad_queries(servers: list[str], checks: Checks, deadline: Deadline,
                            queries: list[str] = BAD_QUERIES) -> None:
    for query in queries:
        problems = []
        for server in servers:
            try:
                status, body = await asyncio.to_thread(http_request, server, "GET", f"/feed?{query}", None,
                                                       deadline.left(10))
                if status != 400:
                    problems.append(f"{server} answered {status}")
                elif not one_line(body):
                    problems.append(f"{server}: 400 without a one-line reason: {body[:120]!r}")
            except Exception as error:  # noqa: BLE001
                problems.append(f"{server}: {type(error).__name__}: {error}")
        checks.check(f"bad-query-http {query}", not problems, "; ".join(problems))

        problems = []
        for server in servers:
            try:
                ws = await connect(f"ws://{server}/feed?{query}", proxy=None, open_timeout=max(deadline.left(10), 0.1))
                await ws.close()
                problems.append(f"{server} accepted the upgrade")
            except InvalidStatus as rejected:
                if rejected.response.status_code != 400:
                    problems.append(f"{server} rejected with {rejected.response.status_code}, not 400")
            except Exception as error:  # noqa: BLE001
                problems.append(f"{server}: {type(error).__name__}: {error}")
        checks.check(f"bad-query-upgrade {query}", not problems, "; ".join(problems))


async def get_stats(server: str, deadline: Deadline) -> dict:
    status, body = await asyncio.to_thread(http_request, server, "GET", "/stats", None, deadline.left(10))
    if status != 200:
        raise ValueError(f"GET /stats answered {status}")
    stats = json.loads(body)
    missing = [key for key in STATS_KEYS if not isinstance(stats.get(key), (int, float))]
    if missing:
        raise ValueError(f"/stats lacks numeric {', '.join(missing)}: {body[:200]!r}")
    return stats


async def open_or_fail(client: "Client", errors: list[str], deadline: Deadline) -> None:
    """Opens one client; one that cannot connect is marked failed (ready and done,
    with its error) so that nothing waits for it."""
    try:
        await client.open(deadline.left(15))
    except Exception as error:  # noqa: BLE001
        client.error = f"connect: {type(error).__name__}: {error}"
        errors.append(f"{client.name}: {client.error}")
        client.ready.set()
        client.done.set()


async def wait_all(events: list[asyncio.Event], timeout: float) -> bool:
    if not events:
        return True
    try:
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in events)), max(timeout, 0.01))
        return True
    except asyncio.TimeoutError:
        return False


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def summarize(problems: list[str], limit: int = 3) -> str:
    more = f" (and {len(problems) - limit} more)" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more


async def run(args: argparse.Namespace, checks: Checks) -> None:
    deadline = Deadline(args.timeout)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    run_id = uuid.uuid4().hex[:12]
    last_n = args.messages - 1

    # 1. Bad input is refused before any upgrade, and the server keeps serving.
    await check_bad_queries(servers, checks, deadline)
    problems = []
    for server in servers:
        try:
            await get_stats(server, deadline)
        except Exception as error:  # noqa: BLE001
            problems.append(f"{server}: {error}")
    checks.check("serves-after-bad-queries", not problems, "; ".join(problems))

    # 2. Connect everyone and wait for every `ready`.
    clients = [Client(i, servers[i % len(servers)], False, run_id, last_n) for i in range(args.clients)]
    clients += [Client(args.clients + i, servers[i % len(servers)], True, run_id, last_n) for i in range(args.slow)]
    gate = asyncio.Semaphore(16)
    connect_errors: list[str] = []

    async def open_one(client: Client) -> None:
        async with gate:
            await open_or_fail(client, connect_errors, deadline)

    started = time.monotonic()
    checked_drops = False
    try:
        await asyncio.gather(*(open_one(client) for client in clients))
        ready_in_time = await wait_all([c.ready for c in clients], deadline.left(30))
        not_ready = [c.name + (f" ({c.error})" if c.error else
                               f" (first frame {c.frames[0][1].get('type')!r})" if c.frames else " (no frame)")
                     for c in clients if not (c.frames and c.frames[0][1].get("type") == "ready")]
        ok = ready_in_time and not not_ready
        checks.check("ready", ok, "timed out waiting for ready; " * (not ready_in_time)
                     + f"{len(not_ready)} of {len(clients)} without `ready` as first frame: {summarize(not_ready)}")
        print(f"info: {len(clients)} clients ready in {time.monotonic() - started:.2f}s", flush=True)

        problems = []
        dropped_before: dict[str, int] = {}
        for server in servers:
            ours = sum(1 for c in clients if c.server == server and c.ws is not None and c.error is None)
            try:
                stats = await get_stats(server, deadline)
                dropped_before[server] = stats["dropped"]
                if stats["subscribers"] < ours:
                    problems.append(f"{server} reports {stats['subscribers']} subscribers, {ours} of ours are open")
            except Exception as error:  # noqa: BLE001
                problems.append(f"{server}: {error}")
        checks.check("stats-subscribers", not problems, "; ".join(problems))

        # 3. Publish, alternating between the servers, each POST after the previous one's 200.
        publishers = [Publisher(server) for server in servers]
        pad = base64.b64encode(os.urandom(args.pad * 3 // 4 + 1)).decode()[: args.pad]
        publish_problems = []
        published = 0
        t0 = time.monotonic()
        try:
            for n in range(args.messages):
                delay = t0 + n / args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if deadline.left() <= 0:
                    publish_problems.append(f"timed out after {published} of {args.messages} publishes")
                    break
                body = json.dumps({"run": run_id, "n": n, "sent": int(time.time() * 1000), "pad": pad})
                publisher = publishers[n % len(publishers)]
                try:
                    status = await asyncio.to_thread(publisher.post, body.encode(), deadline.left(10))
                except Exception as error:  # noqa: BLE001
                    publish_problems.append(f"n={n} via {publisher.server}: {type(error).__name__}: {error}")
                    break
                if status != 200:
                    publish_problems.append(f"n={n} via {publisher.server}: HTTP {status}")
                    break
                published += 1
        finally:
            for publisher in publishers:
                publisher.close()
        elapsed = time.monotonic() - t0
        checks.check("publish", not publish_problems, "; ".join(publish_problems))
        print(f"info: published {published} messages in {elapsed:.2f}s ({published / max(elapsed, 1e-9):.0f}/s), "
              f"bodies padded with {len(pad)} bytes", flush=True)

        # 4. Wait for the fast clients, then let the slow ones read the rest at full speed.
        fast = [c for c in clients if not c.slow]
        slow = [c for c in clients if c.slow]
        fast_in_time = await wait_all([c.done for c in fast], deadline.left())
        for client in slow:
            client.drain.set()
        slow_in_time = await wait_all([c.done for c in slow], deadline.left())

        # `online` arrives at most once a second: give the last count a moment to arrive.
        def online_settled() -> bool:
            for client in clients:
                if client.error is None and not client.online:
                    return False
                ours = sum(1 for c in clients if c.server == client.server and c.error is None)
                if not client.slow and client.error is None and client.online[-1][1] < ours:
                    return False
            return True

        settle = Deadline(min(3.0, deadline.left()))
        while not online_settled() and settle.left() > 0:
            await asyncio.sleep(0.1)

        # 5. The checks.
        expected = list(range(published))
        problems = []
        for client in fast:
            if client.error:
                problems.append(f"{client.name}: {client.error}")
            elif client.ns != expected:
                missing = sorted(set(expected) - set(client.ns))
                dupes = len(client.ns) - len(set(client.ns))
                out_of_order = sum(1 for a, b in zip(client.ns, client.ns[1:]) if b <= a)
                problems.append(f"{client.name}: got {len(client.ns)} of {published}, missing {missing[:5]}"
                                f"{'...' if len(missing) > 5 else ''}, {dupes} duplicates, {out_of_order} out of order")
        reason = ("timed out waiting for the last message; " if not fast_in_time else "") + summarize(problems)
        checks.check("fast-all-in-order", fast_in_time and not problems, reason)

        problems = [f"{c.name}: {len(c.gaps)} gap frames, dropped {c.gaps[-1]}" for c in fast if c.gaps]
        checks.check("fast-no-gap", not problems, summarize(problems))

        if len(servers) < 2:
            checks.skip("cross-server", "only one server")
        else:
            problems = []
            for server in servers:
                others = {n for n in expected if servers[n % len(servers)] != server}
                for client in fast:
                    if client.server == server and not others <= set(client.ns):
                        problems.append(f"{client.name} missed {len(others - set(client.ns))} of the "
                                        f"{len(others)} messages published to the other server(s)")
            checks.check("cross-server", not problems and published > len(servers), summarize(problems)
                         or f"only {published} messages published")

        problems = []
        for client in clients:
            bad = [(a, b) for a, b in zip(client.seqs, client.seqs[1:]) if b <= a]
            if bad:
                problems.append(f"{client.name}: seq {bad[0][0]} then {bad[0][1]} ({len(bad)} times)")
        problems += [f"{c.name}: unreadable frames {c.bad_frames[:2]}" for c in clients if c.bad_frames]
        checks.check("seq-increasing", not problems, summarize(problems))

        problems = [f"{c.name}: {c.sent_mismatch[0]}" for c in clients if c.sent_mismatch]
        checks.check("sent-copied", not problems, summarize(problems))

        problems = []
        for client in clients:
            if any(not isinstance(d, int) or d <= 0 for d in client.gaps):
                problems.append(f"{client.name}: gap frames {client.gaps[:5]}")
            elif any(b <= a for a, b in zip(client.gaps, client.gaps[1:])):
                problems.append(f"{client.name}: `dropped` not growing: {client.gaps[:8]}")
        checks.check("gap-cumulative", not problems, summarize(problems))

        if not slow:
            checks.skip("slow-gap", "no slow clients")
        else:
            problems = []
            for client in slow:
                missed = published - len(set(client.ns))
                out_of_order = sum(1 for a, b in zip(client.ns, client.ns[1:]) if b <= a)
                if client.error:
                    problems.append(f"{client.name}: {client.error}")
                elif not client.gaps:
                    problems.append(f"{client.name}: no gap frame, got {len(client.ns)} of {published}")
                elif out_of_order:
                    problems.append(f"{client.name}: {out_of_order} messages out of order")
                elif client.gaps[-1] < missed:
                    problems.append(f"{client.name}: missed {missed} messages, gap frames told of {client.gaps[-1]}")
                print(f"info: {client.name}: got {len(client.ns)} of {published}, {len(client.gaps)} gap frames, "
                      f"dropped {client.gaps[-1] if client.gaps else 0}", flush=True)
            reason = ("timed out waiting for the slow clients' last message; " if not slow_in_time else "")
            checks.check("slow-gap", slow_in_time and not problems, reason + summarize(problems))

        problems = [] if any(c.error is None for c in clients) else ["no client stayed connected"]
        for client in clients:
            if client.error:
                continue  # reported above
            ours = sum(1 for c in clients if c.server == client.server and c.error is None)
            counts = [count for _, count in client.online]
            if not counts:
                problems.append(f"{client.name}: no online frame")
            elif any(not isinstance(count, int) or count < 1 for count in counts):
                problems.append(f"{client.name}: online counts {counts[:5]}")
            elif not client.slow and counts[-1] < ours:
                problems.append(f"{client.name}: last online count {counts[-1]}, {ours} of ours are connected")
        checks.check("online-count", not problems, summarize(problems))

        problems = []
        for client in fast:
            times = [t for t, _ in client.online]
            close = [b - a for a, b in zip(times, times[1:]) if b - a < 0.5]
            if close:
                problems.append(f"{client.name}: two online frames {min(close) * 1000:.0f} ms apart")
        checks.check("online-rate", not problems, summarize(problems))

        latencies = [ms for c in fast for ms in c.latencies_ms]
        if latencies:
            p99 = percentile(latencies, 99)
            print(f"info: end-to-end latency over {len(latencies)} deliveries: p50 {percentile(latencies, 50):.1f} ms, "
                  f"p99 {p99:.1f} ms, max {max(latencies):.1f} ms", flush=True)
            if args.max_p99_ms > 0:
                # A slow client must not hold the others back (a hub that waits for each client would).
                checks.check("fast-latency", p99 <= args.max_p99_ms,
                             f"fast clients' p99 end-to-end latency {p99:.0f} ms is above {args.max_p99_ms:g} ms")
        # Before the close below, which ends every read loop with an error.
        checked_drops = not any(c.error for c in clients)
    finally:
        await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)
    if checked_drops:
        await check_dropped_exact(servers, clients, dropped_before, checks, deadline)
    else:
        checks.skip("stats-dropped-exact", "a client failed above")


async def check_dropped_exact(servers: list[str], clients: list["Client"], dropped_before: dict[str, int],
                              checks: Checks, deadline: Deadline) -> None:
    """Each drop is counted once in /stats: every client read up to the last message, so its last
    gap frame holds all it lost, and the servers' `dropped` must grow by exactly the sum of those
    (a hub that counts a drop at the send and again at the close shows twice as many)."""
    if set(dropped_before) != set(servers):
        checks.skip("stats-dropped-exact", "a server's /stats failed above")
        return
    told = sum(c.gaps[-1] for c in clients if c.gaps and isinstance(c.gaps[-1], int))
    counted = None
    settle = Deadline(min(10.0, deadline.left()))
    while True:  # a hand-written hub adds a connection's drops when it closes, just after the client left
        try:
            counted = sum([(await get_stats(s, deadline))["dropped"] - dropped_before[s] for s in servers])
        except Exception as error:  # noqa: BLE001
            checks.check("stats-dropped-exact", False, f"GET /stats: {type(error).__name__}: {error}")
            return
        if counted == told or settle.left() <= 0:
            break
        await asyncio.sleep(0.1)
    print(f"info: the clients' last gap frames told of {told} drops; /stats counted {counted}", flush=True)
    checks.check("stats-dropped-exact", counted == told,
                 f"the servers' /stats dropped grew by {counted}, the clients' gap frames told of {told}")


def raw_request(server: str, request: bytes, timeout: float) -> tuple[int, dict[str, str], bytes]:
    """Sends `request` as is and reads one response: status, headers (lower-case names) and
    body (by Content-Length; none after a 101, whose connection is then closed unread)."""
    host, port = split_host(server)
    with socket.create_connection((host, port), timeout=max(timeout, 0.1)) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ValueError(f"no HTTP status line: {lines[0][:80]!r}")
        status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if status != 101:
            length = int(headers.get("content-length", "0") or 0)
            while len(body) < length:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                body += chunk
        return status, headers, body


async def check_bad_topics(servers: list[str], checks: Checks, deadline: Deadline) -> None:
    """A bad topic is a one-line 400 on both routes: before any upgrade on /feed, and with
    Connection: close on /publish. A 48-character topic is fine."""
    for topic in BAD_TOPICS:
        shown = topic if len(topic) < 12 else f"{topic[:3]}...({len(topic)} chars)"
        for route in ("feed", "publish"):
            if route == "feed":
                key = base64.b64encode(os.urandom(16)).decode()
                request = (f"GET /feed?topic={topic} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
            else:
                request = (f"POST /publish?topic={topic} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                           f"Content-Length: 5\r\n\r\nhello")
            problems = []
            for server in servers:
                try:
                    status, headers, body = await asyncio.to_thread(raw_request, server, request.encode(),
                                                                    deadline.left(10))
                    if status != 400:
                        problems.append(f"{server} answered {status}" + " (upgraded)" * (status == 101))
                    elif route == "publish" and not one_line(body):
                        problems.append(f"{server}: 400 without a one-line reason: {body[:120]!r}")
                    elif route == "publish" and headers.get("connection", "").lower() != "close":
                        problems.append(f"{server}: 400 without Connection: close")
                    if route == "feed":
                        # The refused upgrade's 400 has no body (hummingbird-websocket's); the reason
                        # is on the plain GET, which the route refuses the same way.
                        status, body = await asyncio.to_thread(http_request, server, "GET", f"/feed?topic={topic}",
                                                               None, deadline.left(10))
                        if status != 400 or not one_line(body):
                            problems.append(f"{server}: plain GET answered {status} {body[:120]!r}, "
                                            f"not 400 with a one-line reason")
                except Exception as error:  # noqa: BLE001
                    problems.append(f"{server}: {type(error).__name__}: {error}")
            checks.check(f"bad-topic-{route} {shown!r}", not problems, "; ".join(problems))
    problems = []
    for server in servers:
        try:
            status, _ = await asyncio.to_thread(http_request, server, "POST", "/publish?topic=" + "a" * 48,
                                                b"48", deadline.left(10))
            if status != 200:
                problems.append(f"{server} answered {status}")
        except Exception as error:  # noqa: BLE001
            problems.append(f"{server}: {type(error).__name__}: {error}")
    checks.check("topic-48-chars-ok", not problems, "; ".join(problems))


async def listening_topics(servers: list[str], deadline: Deadline) -> list[int]:
    result = []
    for server in servers:
        value = (await get_stats(server, deadline)).get("listeningTopics")
        if not isinstance(value, int):
            raise ValueError(f"{server}: /stats has no integer listeningTopics")
        result.append(value)
    return result


async def wait_unlistened(servers: list[str], deadline: Deadline) -> tuple[float | None, list[int]]:
    """Polls /stats until no server LISTENs on any topic: (seconds it took or None, last values)."""
    started = time.monotonic()
    wait = Deadline(min(UNLISTEN_WAIT, deadline.left()))
    values: list[int] = []
    while True:
        values = await listening_topics(servers, deadline)
        if all(v == 0 for v in values):
            return time.monotonic() - started, values
        if wait.left() <= 0:
            return None, values
        await asyncio.sleep(0.1)


async def run_topics(args: argparse.Namespace, checks: Checks) -> None:
    deadline = Deadline(args.timeout)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    run_id = uuid.uuid4().hex[:12]
    # Topic 0 is the default topic, named by nobody; the others are this run's own.
    topics: list[str | None] = [None] + [f"wsc-{run_id}-{t}" for t in range(1, args.topics)]
    names = [t or DEFAULT_TOPIC for t in topics]

    # 1. Bad topics.
    await check_bad_topics(servers, checks, deadline)

    # 2. Start from no LISTEN (an earlier section's topic lingers 5 s on the broadcast hub).
    took, values = await wait_unlistened(servers, deadline)
    checks.check("topic-listening-before", took is not None,
                 f"listeningTopics {values} on {servers} still, {UNLISTEN_WAIT:g} s after the start")

    # 3. Clients: --topic-clients per topic and server, but the last topic on the first server only,
    #    so the servers LISTEN on different numbers of topics.
    per_topic = [args.topic_messages // len(topics) + (1 if t < args.topic_messages % len(topics) else 0)
                 for t in range(len(topics))]
    clients: list[Client] = []
    for t, topic in enumerate(topics):
        for s, server in enumerate(servers):
            if t == len(topics) - 1 and s > 0:
                continue
            for _ in range(args.topic_clients):
                clients.append(Client(len(clients), server, False, run_id, per_topic[t] - 1, topic=topic))
                clients[-1].topic_section = True
    try:
        connect_errors = []
        for client in clients:
            await open_or_fail(client, connect_errors, deadline)
        ready_in_time = await wait_all([c.ready for c in clients], deadline.left(30))
        not_ready = [c.name + (f" ({c.error})" if c.error else "")
                     for c in clients if not (c.frames and c.frames[0][1].get("type") == "ready")]
        checks.check("topic-ready", ready_in_time and not not_ready,
                     f"{len(not_ready)} of {len(clients)} without `ready` first: {summarize(not_ready)}")

        # 4. listeningTopics while connected: the topics of each server's clients.
        wanted = [len({c.topic for c in clients if c.server == server}) for server in servers]
        try:
            values = await listening_topics(servers, deadline)
            checks.check("topic-listening-connected", values == wanted,
                         f"listeningTopics {values}, the servers' clients are on {wanted} topics")
        except Exception as error:  # noqa: BLE001
            checks.check("topic-listening-connected", False, f"{type(error).__name__}: {error}")

        # 5. Publish: message i to topic i mod T (its k-th), through server i mod S.
        publishers = [Publisher(server) for server in servers]
        problems = []
        t0 = time.monotonic()
        try:
            for i in range(args.topic_messages):
                delay = t0 + i / args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                t = i % len(topics)
                body = json.dumps({"run": run_id, "topic": names[t], "n": i // len(topics),
                                   "sent": int(time.time() * 1000)})
                path = "/publish" if topics[t] is None else f"/publish?topic={topics[t]}"
                publisher = publishers[i % len(publishers)]
                try:
                    status = await asyncio.to_thread(publisher.post, body.encode(), deadline.left(10), path)
                except Exception as error:  # noqa: BLE001
                    problems.append(f"#{i} to {names[t]} via {publisher.server}: {type(error).__name__}: {error}")
                    break
                if status != 200:
                    problems.append(f"#{i} to {names[t]} via {publisher.server}: HTTP {status}")
                    break
        finally:
            for publisher in publishers:
                publisher.close()
        checks.check("topic-publish", not problems, "; ".join(problems))
        print(f"info: {len(clients)} clients on {len(topics)} topics ({', '.join(names)}), "
              f"{args.topic_messages} messages {per_topic} per topic", flush=True)

        # 6. Every client gets its topic's messages in order; nobody gets another topic's.
        in_time = await wait_all([c.done for c in clients], deadline.left(20))
        await asyncio.sleep(min(0.5, deadline.left()))  # a stray message of another topic would come by now
        problems = []
        for client in clients:
            expected = list(range(client.last_n + 1))
            if client.error:
                problems.append(f"{client.name}: {client.error}")
            elif client.ns != expected:
                problems.append(f"{client.name}: got {client.ns[:8]}{'...' if len(client.ns) > 8 else ''} "
                                f"of its topic's {len(expected)}")
        checks.check("topic-all-in-order: every client got its topic's messages in order",
                     in_time and not problems,
                     ("timed out; " if not in_time else "") + summarize(problems))
        foreign = [c for c in clients if c.foreign]
        checks.check("topic-isolation: no client got another topic's message", not foreign,
                     f"{len(foreign)} of {len(clients)} clients did, {sum(len(c.foreign) for c in foreign)} "
                     f"messages; first: {foreign[0].name if foreign else ''} got {foreign[0].foreign[:3] if foreign else ''}")
        problems = []
        for client in clients:
            bad = [(a, b) for a, b in zip(client.seqs, client.seqs[1:]) if b <= a]
            if bad:
                problems.append(f"{client.name}: seq {bad[0][0]} then {bad[0][1]}")
        checks.check("topic-seq-increasing", not problems, summarize(problems))

        # 7. `online` counts the connections on the client's own topic (at most once a second).
        def ours(client: Client) -> int:
            return sum(1 for c in clients if c.server == client.server and c.topic == client.topic and c.error is None)

        def online_ok(client: Client) -> bool:
            if not client.online:
                return False
            last = client.online[-1][1]
            # This run's topics are nobody else's; `feed` may have other clients.
            return last == ours(client) if client.topic is not None else isinstance(last, int) and last >= ours(client)

        settle = Deadline(min(3.0, deadline.left()))
        while not all(online_ok(c) for c in clients if c.error is None) and settle.left() > 0:
            await asyncio.sleep(0.1)
        problems = [f"{c.name}: last online {c.online[-1][1] if c.online else None}, {ours(c)} on its topic"
                    for c in clients if c.error is None and not online_ok(c)]
        checks.check("topic-online-count", not problems, summarize(problems))
    finally:
        await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)

    # 8. Once the clients have left, no LISTEN is left (broadcast hub: 5 s later).
    took, values = await wait_unlistened(servers, deadline)
    checks.check("topic-listening-after", took is not None,
                 f"listeningTopics {values} {UNLISTEN_WAIT:g} s after the clients left")
    if took is not None:
        print(f"info: listeningTopics back to 0 on every server {took:.1f}s after the clients left", flush=True)


BAD_RECOVERY_QUERIES = [
    "since=5",
    "epoch=5",
    "since=-1&epoch=5",
    "since=abc&epoch=5",
    "since=1&epoch=0",
]


async def next_frame(ws, timeout: float) -> dict:
    """The next frame that is not `online` (those come at most once a second, any time)."""
    end = time.monotonic() + timeout
    while True:
        raw = await asyncio.wait_for(ws.recv(), max(end - time.monotonic(), 0.01))
        frame = json.loads(raw)
        if frame.get("type") != "online":
            return frame


async def frames_until(ws, kinds: set[str], timeout: float) -> list[dict]:
    """Frames (not `online`) up to and including the first of `kinds`; what came before it if the
    timeout passes first (then the last element is {"type": "timeout"})."""
    frames: list[dict] = []
    end = time.monotonic() + timeout
    try:
        while True:
            frame = await next_frame(ws, end - time.monotonic())
            frames.append(frame)
            if frame.get("type") in kinds:
                return frames
    except (asyncio.TimeoutError, ConnectionClosed) as error:
        frames.append({"type": "timeout", "error": type(error).__name__})
        return frames


def body_n(frame: dict) -> int | None:
    try:
        return json.loads(frame.get("body", "")).get("n")
    except (ValueError, AttributeError):
        return None


def show(frames: list[dict], limit: int = 6) -> str:
    brief = [f"{f.get('type')}" + (f"#{f.get('seq')}" if f.get("type") == "message" else
                                   f"{ {k: v for k, v in f.items() if k != 'type'} }" if len(f) > 1 else "")
             for f in frames]
    return ", ".join(brief[:limit]) + (f" ... ({len(frames)} frames)" if len(frames) > limit else "")


async def run_recovery(args: argparse.Namespace, checks: Checks) -> None:
    deadline = Deadline(args.timeout)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    run_id = uuid.uuid4().hex[:12]
    await check_bad_queries(servers, checks, deadline, BAD_RECOVERY_QUERIES)
    publishers = [Publisher(server) for server in servers]
    counter = 0

    async def publish(topic: str, count: int) -> list[int]:
        nonlocal counter
        sent = []
        for _ in range(count):
            body = json.dumps({"run": run_id, "n": counter, "sent": int(time.time() * 1000)})
            publisher = publishers[counter % len(publishers)]
            status = await asyncio.to_thread(publisher.post, body.encode(), deadline.left(10), f"/publish?topic={topic}")
            if status != 200:
                raise ValueError(f"publish #{counter} via {publisher.server}: HTTP {status}")
            sent.append(counter)
            counter += 1
        return sent

    async def wait_for(ws, last: int) -> None:
        """Reads `ws` until the message with n == last (the topic's messages are in every window then)."""
        end = time.monotonic() + deadline.left(20)
        while body_n(await next_frame(ws, end - time.monotonic())) != last:
            pass

    options = dict(proxy=None, open_timeout=10, close_timeout=2, ping_interval=None, max_size=None)
    try:
        for s, server in enumerate(servers):
            topic = f"wsr-{run_id}-{s}"
            url = f"ws://{server}/feed?topic={topic}&policy=newest&capacity=250"
            sockets = []
            try:
                # The anchor keeps the topic, its numbering and its window on this server while the client is away.
                anchor = await connect(url, **options)
                sockets.append(anchor)
                first = await connect(url, **options)
                sockets.append(first)
                ready = await next_frame(first, deadline.left(10))
                epoch, ready_seq = ready.get("epoch"), ready.get("seq")
                checks.check(f"recovery-ready-epoch {server}",
                             ready.get("type") == "ready" and isinstance(epoch, int) and epoch > 0
                             and isinstance(ready_seq, int),
                             f"first frame {ready}")
                await next_frame(anchor, deadline.left(10))  # its ready
                read = await publish(topic, 3)
                last_seq = ready_seq if isinstance(ready_seq, int) else 0
                while True:
                    frame = await next_frame(first, deadline.left(10))
                    if frame.get("type") == "message":
                        last_seq = frame["seq"]
                        if body_n(frame) == read[-1]:
                            break
                await first.close()
                missed = await publish(topic, args.recovery_missed)
                await wait_for(anchor, missed[-1])

                back = await connect(f"{url}&since={last_seq}&epoch={epoch}", **options)
                sockets.append(back)
                frames = await frames_until(back, {"recovered", "resync"}, deadline.left(10))
                messages = [f for f in frames if f.get("type") == "message"]
                want_seqs = list(range(last_seq + 1, last_seq + 1 + len(missed)))
                ok = (frames[0].get("type") == "ready" and frames[0].get("epoch") == epoch
                      and [body_n(f) for f in messages] == missed and [f.get("seq") for f in messages] == want_seqs
                      and len(frames) == len(missed) + 2 and frames[-1] == {"type": "recovered", "from": last_seq + 1,
                                                                             "to": want_seqs[-1]})
                checks.check(f"recovery-missed-then-recovered {server}: the {len(missed)} missed messages in order, "
                             f"then recovered", ok,
                             f"since {last_seq}: wanted ready, messages n {missed[0]}..{missed[-1]} (seq "
                             f"{want_seqs[0]}..{want_seqs[-1]}), recovered; got {show(frames)}; n "
                             f"{[body_n(f) for f in messages][:6]}")
                live = await publish(topic, 3)
                got = []
                try:
                    while len(got) < len(live):
                        frame = await next_frame(back, deadline.left(10))
                        got.append(frame)
                except (asyncio.TimeoutError, ConnectionClosed):
                    pass
                checks.check(f"recovery-live-after {server}: then live messages, no duplicate, no gap",
                             [body_n(f) for f in got] == live
                             and [f.get("seq") for f in got] == list(range(want_seqs[-1] + 1, want_seqs[-1] + 1 + len(live))),
                             f"wanted n {live} seq from {want_seqs[-1] + 1}; got {show(got)} n {[body_n(f) for f in got]}")

                for label, query in [("another epoch", f"since={last_seq}&epoch={epoch + 1}"),
                                     ("a since ahead of the topic", f"since={want_seqs[-1] + 1000}&epoch={epoch}")]:
                    ws = await connect(f"{url}&{query}", **options)
                    sockets.append(ws)
                    frames = await frames_until(ws, {"recovered", "resync"}, deadline.left(10))
                    checks.check(f"recovery-resync {server}: {label}",
                                 [f.get("type") for f in frames] == ["ready", "resync"]
                                 and isinstance(frames[-1].get("reason"), str),
                                 f"{query}: got {show(frames)}")
                if s == 0 and args.history_messages > 0:
                    # Push since+1 out of the window by count.
                    flood = await publish(topic, args.history_messages + 5)
                    await wait_for(anchor, flood[-1])
                    ws = await connect(f"{url}&since={last_seq}&epoch={epoch}", **options)
                    sockets.append(ws)
                    frames = await frames_until(ws, {"recovered", "resync"}, deadline.left(10))
                    checks.check(f"recovery-resync {server}: a since the window no longer holds "
                                 f"({args.history_messages + 5} messages later)",
                                 [f.get("type") for f in frames] == ["ready", "resync"],
                                 f"since {last_seq}: got {show(frames)}")
            finally:
                await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    except Exception as error:  # noqa: BLE001
        checks.check("recovery-finished", False, f"{type(error).__name__}: {error}")
    finally:
        for publisher in publishers:
            publisher.close()


async def run_batch(args: argparse.Namespace, checks: Checks) -> None:
    """The batched write path: a client that stops reading while --batch-messages messages
    are published (through a 4 KiB receive buffer, so they pile up in its subscription),
    then reads them all at once. Every message must arrive, in order, without a gap frame,
    and the server must have written them in fewer flushes than messages (/stats `writes`:
    the pumps' batches, each one flush)."""
    deadline = Deadline(args.timeout)
    server = [s.strip() for s in args.servers.split(",") if s.strip()][0]
    run_id = uuid.uuid4().hex[:12]
    topic = f"batch-{run_id}"
    count = args.batch_messages
    host, port = split_host(server)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
    sock.setblocking(False)
    ws = None
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host, port)), deadline.left(15))
        # max_queue=1: the library stops reading the socket while a frame waits unread.
        ws = await connect(f"ws://{server}/feed?topic={topic}&policy=newest&capacity={FAST_CAPACITY}", sock=sock,
                           max_queue=1, compression=None, ping_interval=None, proxy=None,
                           open_timeout=deadline.left(15), close_timeout=2, max_size=None)
        while json.loads(await asyncio.wait_for(ws.recv(), deadline.left(15))).get("type") != "ready":
            pass
        before = await get_stats(server, deadline)
        publisher = Publisher(server)
        pad = base64.b64encode(os.urandom(3000)).decode()  # 4,000 incompressible bytes
        statuses = []
        for n in range(count):
            body = json.dumps({"run": run_id, "n": n, "sent": int(time.time() * 1000), "pad": pad}).encode()
            statuses.append(await asyncio.to_thread(publisher.post, body, deadline.left(10), f"/publish?topic={topic}"))
        publisher.close()
        ns, gaps, seqs = [], 0, []
        while len(ns) < count and deadline.left() > 0:
            frame = json.loads(await asyncio.wait_for(ws.recv(), deadline.left(10)))
            if frame.get("type") == "gap":
                gaps += 1
            elif frame.get("type") == "message":
                seqs.append(frame.get("seq"))
                payload = json.loads(frame["body"])
                if payload.get("run") == run_id:
                    ns.append(payload.get("n"))
        after = await get_stats(server, deadline)
    except Exception as error:  # noqa: BLE001
        checks.check("batch-in-order", False, f"{type(error).__name__}: {error}")
        return
    finally:
        if ws is not None:
            try:
                await asyncio.wait_for(ws.close(), 5)
            except Exception:  # noqa: BLE001
                pass
        else:
            sock.close()
    checks.check("batch-published", statuses == [200] * count, f"statuses {sorted(set(statuses))}")
    checks.check("batch-in-order", ns == list(range(count)) and gaps == 0 and seqs == sorted(seqs),
                  f"got {len(ns)} of {count}, first out of place at {next((i for i, n in enumerate(ns) if n != i), None)}, "
                  f"{gaps} gap frames")
    delivered = after["delivered"] - before["delivered"]
    writes = after.get("writes", 0) - before.get("writes", 0)
    print(f"info: batch: {delivered} messages delivered in {writes} writes", flush=True)
    if not args.batch_flushes:
        return
    checks.check("batch-fewer-flushes-than-messages", "writes" in after and 0 < writes < delivered,
                 f"{delivered} messages delivered in {writes} writes (/stats writes: {after.get('writes')!r})")


async def run_all(args: argparse.Namespace, checks: Checks) -> None:
    if args.batch_messages and not args.only_recovery:
        await run_batch(args, checks)
    if not (args.only_topics or args.only_recovery):
        await run(args, checks)
    if args.topics >= 2 and not args.only_recovery:
        await run_topics(args, checks)
    if args.recovery or args.only_recovery:
        await run_recovery(args, checks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="127.0.0.1:8080,127.0.0.1:8081",
                        help="comma-separated HOST:PORT of the feed servers")
    parser.add_argument("--clients", type=int, default=50, help="fast clients (policy newest, capacity 250)")
    parser.add_argument("--messages", type=int, default=200, help="messages to publish")
    parser.add_argument("--rate", type=float, default=100, help="publishes per second")
    parser.add_argument("--slow", type=int, default=1, help="slow clients (capacity 8, 10 reads a second)")
    parser.add_argument("--pad", type=int, default=2000, help="bytes of incompressible padding per body")
    parser.add_argument("--max-p99-ms", type=float, default=2000,
                        help="fail if the fast clients' p99 end-to-end latency is above this (0: no check)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds for each section")
    parser.add_argument("--topics", type=int, default=0,
                        help="run the topic section with this many topics (at least 2; 0: no topic section)")
    parser.add_argument("--topic-clients", type=int, default=2, help="clients per topic and server in the topic section")
    parser.add_argument("--topic-messages", type=int, default=60, help="messages the topic section publishes")
    parser.add_argument("--only-topics", action="store_true", help="run the topic section only")
    parser.add_argument("--recovery", action="store_true", help="run the recovery section too (since=, epoch=)")
    parser.add_argument("--only-recovery", action="store_true", help="run the recovery section only")
    parser.add_argument("--recovery-missed", type=int, default=10, help="messages a client misses while away")
    parser.add_argument("--history-messages", type=int, default=1000,
                        help="the servers' --history-messages: this many + 5 push a since out (0: skip that check)")
    parser.add_argument("--batch-flushes", action="store_true",
                        help="with --batch-messages: the servers run --batch-writes, so the batch takes fewer flushes than messages")
    parser.add_argument("--batch-messages", type=int, default=0,
                        help="first, the batch section with this many messages (0: none; at most 250)")
    args = parser.parse_args()
    if args.recovery_missed < 1:
        parser.error("--recovery-missed must be at least 1")
    if args.topics == 1 or args.topics < 0 or (args.only_topics and args.topics < 2):
        parser.error("--topics must be 0 or at least 2 (and at least 2 with --only-topics)")
    if args.topics and (args.topic_clients < 1 or args.topic_messages < args.topics):
        parser.error("--topic-clients must be at least 1 and --topic-messages at least --topics")
    if args.messages < 1 or args.rate <= 0 or args.clients < 0 or args.slow < 0 or args.pad < 0:
        parser.error("--messages must be at least 1; --rate, --clients, --slow and --pad not negative")
    if args.messages > FAST_CAPACITY:
        print(f"warning: more than {FAST_CAPACITY} messages: a fast client that falls behind may drop", file=sys.stderr)

    checks = Checks()
    main_section = "" if args.only_topics or args.only_recovery else (f", {args.clients} fast + {args.slow} slow clients, "
                                                 f"{args.messages} messages at {args.rate:g}/s")
    topic_section = f", then {args.topics} topics" if args.topics else ""
    print(f"info: websockets {websockets.__version__}, servers {args.servers}{main_section}{topic_section}", flush=True)

    if args.only_recovery:
        sections = 1
    else:
        sections = (0 if args.only_topics else 1) + (1 if args.topics >= 2 else 0) + (1 if args.recovery else 0)
    if not 0 <= args.batch_messages <= FAST_CAPACITY:
        parser.error(f"--batch-messages must be between 0 and {FAST_CAPACITY}")
    sections = (0 if args.only_topics else 1) + (1 if args.topics >= 2 else 0) + (1 if args.batch_messages else 0)
    timer = checks.start_watchdog(args.timeout * sections + 30)
    try:
        asyncio.run(asyncio.wait_for(run_all(args, checks), args.timeout * sections + 15))
    except asyncio.TimeoutError:
        checks.check("finished", False, f"the run did not finish within {args.timeout * sections + 15:.0f}s")
    except Exception as error:  # noqa: BLE001
        checks.check("finished", False, f"{type(error).__name__}: {error}")
    timer.cancel()
    print(checks.summary(), flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
