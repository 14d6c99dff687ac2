"""hardening_check.py's groups for the process-wide limits (issue 36, defects 3 to 6):
what one client must not be able to take from the whole process, or reach through it.

  history-cap       8 clients that read, on 8 topics, while 1,600 messages of 7,999 quotes (each
                    frame in a 16 KiB buffer) are published over those topics (26 MB of recovery
                    windows at 1,000 per topic) to a server with --history-bytes 8 MiB (and
                    --history-seconds 3600: only the caps trim, however slow the machine):
                    /stats historyBytes never passes the cap, RSS grows by less than the cap +
                    12 MB and by less than 6 MB over the second half (flat once the cap is
                    reached), a client that comes back with a `since` the cap trimmed gets
                    `resync` naming --history-bytes, one whose `since` is recent gets
                    `recovered` with the messages, and the readers stay connected;
  namespace         a topic is not another application's channel: a psql session that LISTENs on
                    `otherapp_jobs_RUN` gets nothing from POST /publish?topic=otherapp_jobs_RUN
                    (and gets its own NOTIFY: the control), a WebSocket client on that topic gets
                    nothing of psql's NOTIFY on that channel, and psql LISTENing on
                    `livefeed.TOPIC` gets the server's publish;
  topic-cap         64 clients open and close connections on new topics for 4 s against a server
                    with --max-topics 50: /stats liveTopics never passes 50, the refused ones are
                    closed with 1013 and a reason naming --max-topics, a topic already live is
                    still taken at the cap, /metrics has feed_live_topics and feed_topics_limit,
                    and a new topic is taken again once the lingering ones are gone;
  stalled-recovery  100 clients that come back with since=0 for a window of 1,000 messages of
                    1,000 bytes and never read (a 4 KiB receive buffer), and one live client
                    that stopped reading, on quiet topics, against a server with --send-timeout 3
                    (and --max-connections 300): the recovering ones hold less than 120 KB of
                    server memory each, every one of them is closed (/stats evicted) within 9 s of
                    connecting with nothing published meanwhile, and a client that reads stays.

Flags a server does not have (an older build) are left out, so each check runs, and fails,
against it as it is.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import queue
import socket
import struct
import subprocess
import threading
import time
import uuid

from websockets.sync.client import connect as ws_connect

HISTORY_CAP = 8 << 20
MAX_TOPICS = 50
SEND_TIMEOUT = 3

_help_text: dict[str, str] = {}


def supported(args, flags: list[str]) -> list[str]:
    """`flags` (pairs) without the ones the server binary does not know."""
    if args.binary not in _help_text:
        out = subprocess.run([args.binary, "--help"], capture_output=True, text=True, timeout=30)
        _help_text[args.binary] = out.stdout + out.stderr
    text = _help_text[args.binary]
    kept = []
    for name, value in zip(flags[::2], flags[1::2]):
        if name in text:
            kept += [name, value]
        else:
            print(f"  (this server has no {name}: running without it)", flush=True)
    return kept


class Readers:
    """Clients that read everything, each on a thread of its own (Python websockets: it answers
    the server's pings, which Hummingbird sends every 30 s and closes a connection without a
    pong for): they keep their topics live and cost the server nothing but their frames."""

    def __init__(self) -> None:
        self.sockets: list = []
        self.closed: list[str] = []
        self.threads: list[threading.Thread] = []

    def add(self, server: str, path: str) -> dict:
        """Connects to `path`, returns its ready frame; reads on until the connection closes."""
        ready: queue.Queue = queue.Queue()

        def run() -> None:
            try:
                with ws_connect(f"ws://{server}{path}", open_timeout=30, max_size=1 << 20) as ws:
                    self.sockets.append(ws)
                    ready.put(json.loads(ws.recv(30)))
                    for _ in ws:
                        pass
                self.closed.append(path)
            except Exception as error:  # noqa: BLE001 - recorded, and the ready wait fails
                self.closed.append(f"{path}: {type(error).__name__}: {error}")
                ready.put({"type": "error", "error": f"{type(error).__name__}: {error}"})

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)
        frame = ready.get(timeout=40)
        if frame.get("type") != "ready":
            raise ConnectionError(f"{path}: {frame}")
        return frame

    def close(self) -> None:
        for ws in self.sockets:
            try:
                ws.close()
            except Exception:  # noqa: BLE001 - closing at the end
                pass
        for thread in self.threads:
            thread.join(5)


def ready_of(h, server: str, path: str, rcvbuf: int | None = None):
    """Connects to `path`; (socket, frame reader, the ready frame as a dict)."""
    sock, rest = h.ws_handshake(server, path, rcvbuf=rcvbuf)
    reader = h.FrameReader(sock, rest)
    sock.settimeout(30)
    opcode, payload = reader.next()
    frame = json.loads(payload) if opcode == 0x1 else {}
    if frame.get("type") != "ready":
        raise ConnectionError(f"first frame of {path} is not ready: {opcode} {payload[:80]!r}")
    return sock, reader, frame


def frames_until(reader, stop, timeout: float) -> list[dict]:
    """Text frames as dicts until `stop(frame)` is true (that frame included) or `timeout`."""
    got = []
    reader.sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            opcode, payload = reader.next()
            if opcode == 0x8:
                got.append({"type": "close", "code": struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None,
                            "reason": payload[2:].decode(errors="replace")})
                break
            if opcode == 0x1:
                frame = json.loads(payload)
                got.append(frame)
                if stop(frame):
                    break
    except (socket.timeout, ConnectionError, OSError):
        pass
    return got


def publish_all(h, server: str, items: list[tuple[str, bytes]], publishers: int = 4) -> dict:
    """POSTs every (path, body) on `publishers` keep-alive connections; the statuses counted."""
    import collections
    statuses: collections.Counter = collections.Counter()
    lock = threading.Lock()
    threads = [threading.Thread(target=h.post_loop, args=(server, items[k::publishers], statuses, lock), daemon=True)
               for k in range(publishers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return dict(statuses)


def history_cap(args, checks, h) -> None:
    # Ages do not trim here, however slow the machine: only the caps.
    server = h.Server(args, "history-cap", ["--history-seconds", "3600"] + supported(
        args, ["--history-bytes", str(HISTORY_CAP), "--send-timeout", "600"]))
    run = uuid.uuid4().hex[:6]
    topics = [f"cap{i}-{run}" for i in range(8)]
    readers = Readers()
    epochs = {topic: readers.add(server.address, f"/feed?topic={topic}&policy=newest&capacity=250")["epoch"]
              for topic in topics}
    count = 1600
    # Quotes: each is escaped in two in the frame, so a message takes NIO's largest buffer (16 KiB).
    pad = '"' * 7999
    items = [(f"/publish?topic={topics[i % len(topics)]}", f"{run} {i:06d} {pad}"[:7999].encode()) for i in range(count)]
    time.sleep(0.5)
    rss_before = server.rss()
    peaks = {"held": 0, "rss": rss_before}
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            try:
                peaks["held"] = max(peaks["held"], server.stats().get("historyBytes", -1))
            except Exception:  # noqa: BLE001 - a missed sample
                pass
            peaks["rss"] = max(peaks["rss"], server.rss())
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    first = publish_all(h, server.address, items[:count // 2])
    time.sleep(0.3)
    rss_half = max(peaks["rss"], server.rss())
    second = publish_all(h, server.address, items[count // 2:])
    took = time.monotonic() - started
    time.sleep(0.5)
    sampling.set()
    sampler.join(5)
    rss_end = max(peaks["rss"], server.rss())
    stats = server.stats()
    ok = {200: count // 2}
    print(f"  ({count} messages of 7,999 bytes over {len(topics)} topics in {took:.1f} s; RSS {rss_before / 1e6:.0f} -> "
          f"{rss_half / 1e6:.0f} at half -> {rss_end / 1e6:.0f} MB; historyBytes peak {peaks['held']}, now "
          f"{stats.get('historyBytes')}, limit {stats.get('historyLimitBytes')})", flush=True)
    checks.check("history-cap: every publish got 200", first == ok and second == ok, f"statuses {first}, {second}")
    checks.check(f"history-cap: /stats historyBytes never passes --history-bytes ({HISTORY_CAP})",
                 0 <= peaks["held"] <= HISTORY_CAP and "historyBytes" in stats,
                 f"peak {peaks['held']} ({'no historyBytes in /stats' if 'historyBytes' not in stats else 'over the cap'})")
    if args.tsan:
        checks.skip("history-cap: RSS", "ThreadSanitizer build")
    else:
        growth = (rss_end - rss_before) / 1e6
        second_half = (rss_end - rss_half) / 1e6
        bound = HISTORY_CAP / 1e6 + 12
        checks.check(f"history-cap: RSS grows by less than the cap + 12 MB ({bound:.0f} MB) under 26 MB of windows",
                     growth < bound, f"grew {growth:.0f} MB")
        checks.check("history-cap: RSS is flat once the cap is reached (under 6 MB over the second half)",
                     second_half < 6, f"grew {second_half:.1f} MB over the second {count // 2} messages")
    # The first topic's oldest messages were trimmed (the oldest windows first); its last ones are held.
    topic = topics[0]
    sock, reader, ready = ready_of(h, server.address, f"/feed?topic={topic}&since=0&epoch={epochs[topic]}")
    frames = frames_until(reader, lambda f: f["type"] in ("recovered", "resync"), 15)
    sock.close()
    last = frames[-1] if frames else {}
    checks.check("history-cap: a since the cap trimmed gets resync, naming --history-bytes",
                 last.get("type") == "resync" and "--history-bytes" in last.get("reason", ""),
                 f"got {last} after {len(frames) - 1} frames")
    since = max(0, ready["seq"] - 5)
    sock, reader, _ = ready_of(h, server.address, f"/feed?topic={topic}&since={since}&epoch={epochs[topic]}")
    frames = frames_until(reader, lambda f: f["type"] in ("recovered", "resync"), 15)
    sock.close()
    seqs = [f["seq"] for f in frames if f["type"] == "message"]
    checks.check("history-cap: a recent since still gets recovered, with every message after it",
                 frames and frames[-1]["type"] == "recovered" and seqs == list(range(since + 1, since + 6)),
                 f"got {[f['type'] for f in frames][-3:]}, seqs {seqs[:8]}")
    checks.check("history-cap: the readers stayed connected", not readers.closed, f"closed: {readers.closed[:2]}")
    readers.close()
    server.stop()


def psql_session(postgres: str) -> subprocess.Popen:
    return subprocess.Popen(["psql", postgres, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=0"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)


def psql_until(process: subprocess.Popen, marker: str, timeout: float = 10) -> list[str]:
    """Sends two queries, the second `SELECT 'marker';`, and returns the lines up to its answer:
    psql prints a notification that came in meanwhile after the next query's answer, so one
    received before this call is among them."""
    process.stdin.write(f"SELECT 'before {marker}';\nSELECT '{marker}';\n")
    process.stdin.flush()
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        while True:
            line = process.stdout.readline()
            lines.put(line)
            if not line or line.strip() == marker:
                return

    threading.Thread(target=read, daemon=True).start()
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.05, deadline - time.monotonic()))
        except queue.Empty:
            break
        if not line or line.strip() == marker:
            break
        got.append(line.strip())
    return got


def namespace(args, checks, h) -> None:
    server = h.Server(args, "namespace")
    run = uuid.uuid4().hex[:6]
    other = f"otherapp_jobs_{run}"
    # Another application LISTENs on its channel; a client publishes to the topic of that name.
    session = psql_session(args.postgres)
    try:
        session.stdin.write(f"LISTEN {other};\n")
        psql_until(session, "listening")
        status, _ = h.request(server.address, "POST", f"/publish?topic={other}", f"from-feed {run}".encode())
        session.stdin.write(f"NOTIFY {other}, 'control {run}';\n")
        lines = psql_until(session, "done")
        notes = [line for line in lines if "Asynchronous notification" in line]
        control = any(f"control {run}" in line for line in notes)
        leaked = [line for line in notes if f"from-feed {run}" in line]
        checks.check("namespace: POST /publish?topic=NAME does not reach another application's channel NAME",
                     status == 200 and control and not leaked,
                     f"publish {status}; " + ("psql got it: " + leaked[0][:120] if leaked else
                                              "psql did not get its own NOTIFY either (the control)" if not control else ""))
        # And the other way: the other application's NOTIFY does not reach the topic's clients.
        sock, reader, _ = ready_of(h, server.address, f"/feed?topic={other}")
        session.stdin.write(f"NOTIFY {other}, 'from-otherapp {run}';\n")
        psql_until(session, "notified")
        # Published after psql's NOTIFY committed: once it arrives, the NOTIFY would have (one LISTEN connection).
        h.request(server.address, "POST", f"/publish?topic={other}", f"marker {run}".encode())
        frames = frames_until(reader, lambda f: f["type"] == "message" and f"marker {run}" in f["body"], 10)
        sock.close()
        bodies = [f["body"] for f in frames if f["type"] == "message"]
        checks.check("namespace: a NOTIFY on another application's channel NAME does not reach /feed?topic=NAME",
                     bodies == [f"marker {run}"], f"the client got {bodies}")
        # The server's own channel for a topic is in its namespace.
        topic = f"ns-{run}"
        session.stdin.write(f'LISTEN "livefeed.{topic}";\n')
        psql_until(session, "listening2")
        status, _ = h.request(server.address, "POST", f"/publish?topic={topic}", f"namespaced {run}".encode())
        lines = psql_until(session, "done2")
        checks.check("namespace: the topic's channel is livefeed.TOPIC (the default --channel-prefix)",
                     status == 200 and any(f"namespaced {run}" in line and f"livefeed.{topic}" in line for line in lines),
                     f"publish {status}; psql got {[line[:100] for line in lines if 'notification' in line]}")
    finally:
        session.stdin.close()
        try:
            session.wait(10)
        except subprocess.TimeoutExpired:
            session.kill()
    server.stop()


async def topic_churn(server: str, run: str, seconds: float, parallel: int = 64) -> tuple[int, list[tuple[int, str]], list[str]]:
    """Connections to new topics, each closed at its first frame, for `seconds`; (readies,
    refusals as (close code, reason), errors)."""
    host, port = server.split(":")
    readies = 0
    refusals: list[tuple[int, str]] = []
    errors: list[str] = []
    counter = 0
    deadline = time.monotonic() + seconds

    async def one(topic: str) -> None:
        nonlocal readies
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            key = base64.b64encode(os.urandom(16)).decode()
            writer.write((f"GET /feed?topic={topic} HTTP/1.1\r\nHost: {server}\r\nUpgrade: websocket\r\n"
                          f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 101"):
                errors.append(head[:60].decode(errors="replace"))
                return
            first = await reader.readexactly(2)
            length = first[1] & 0x7F
            if length == 126:
                length = struct.unpack("!H", await reader.readexactly(2))[0]
            payload = await reader.readexactly(length)
            if first[0] & 0x0F == 0x8:
                refusals.append((struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 0,
                                 payload[2:].decode(errors="replace")))
            elif b'"ready"' in payload:
                readies += 1
            writer.write(bytes([0x88, 0x82]) + b"\0\0\0\0" + struct.pack("!H", 1000))
            await writer.drain()
            while await reader.read(65536):
                pass
        finally:
            writer.close()

    async def worker() -> None:
        nonlocal counter
        while time.monotonic() < deadline:
            counter += 1
            try:
                await asyncio.wait_for(one(f"tc-{run}-{counter}"), 10)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as error:
                if len(errors) < 5:
                    errors.append(f"{type(error).__name__}: {error}")

    await asyncio.gather(*(worker() for _ in range(parallel)))
    return readies, refusals, errors


def topic_cap(args, checks, h) -> None:
    server = h.Server(args, "topic-cap", supported(args, ["--max-topics", str(MAX_TOPICS)]))
    run = uuid.uuid4().hex[:6]
    held_topic = f"held-{run}"
    readers = Readers()
    readers.add(server.address, f"/feed?topic={held_topic}")
    peak = {"live": 0, "key": "liveTopics"}
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            try:
                stats = server.stats()
                key = "liveTopics" if "liveTopics" in stats else "topics"
                peak["key"] = key
                peak["live"] = max(peak["live"], stats[key])
            except Exception:  # noqa: BLE001 - a missed sample
                pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    readies, refusals, errors = asyncio.run(topic_churn(server.address, run, 4))
    sampling.set()
    sampler.join(5)
    print(f"  (churn: {readies} ready, {len(refusals)} refused, {len(errors)} errors {errors[:2]}; peak {peak['key']} "
          f"{peak['live']})", flush=True)
    checks.check(f"topic-cap: live topics never pass --max-topics ({MAX_TOPICS}) under churn of new topics",
                 peak["key"] == "liveTopics" and peak["live"] <= MAX_TOPICS,
                 f"peak /stats {peak['key']} {peak['live']}")
    named = [r for r in refusals if r[0] == 1013 and "--max-topics" in r[1]]
    # (A connection the churn gave up on, on a loaded machine, is not a refusal: printed above.)
    checks.check("topic-cap: a connection to a new topic at the cap is closed with 1013 and the reason",
                 refusals and len(named) == len(refusals),
                 f"{len(refusals)} refused, codes and reasons {sorted(set(refusals))[:2]}, errors {errors[:2]}")
    live = server.stats().get("liveTopics")
    try:
        sock, _, _ = ready_of(h, server.address, f"/feed?topic={held_topic}")
        sock.close()
        ok, why = True, ""
    except (OSError, ConnectionError) as error:
        ok, why = False, f"{type(error).__name__}: {error}"
    checks.check("topic-cap: a topic already live is still taken (live topics then: %s)" % live, ok, why)
    status, body = h.try_request(server.address, "GET", "/metrics")
    text = body.decode(errors="replace")
    checks.check("topic-cap: /metrics has feed_live_topics and feed_topics_limit",
                 status == 200 and "\nfeed_live_topics " in text and f"\nfeed_topics_limit {MAX_TOPICS}" in text,
                 f"/metrics {status}: {[line for line in text.splitlines() if 'topic' in line][:6]}")
    stats = server.stats()
    checks.check("topic-cap: /stats topicsRefused counts the refusals", stats.get("topicsRefused", -1) >= len(refusals) > 0,
                 f"topicsRefused {stats.get('topicsRefused')}, {len(refusals)} refused")
    # The churned topics linger 5 s after their client; then new topics are taken again.
    deadline = time.monotonic() + 15
    while server.stats().get("liveTopics", 0) >= MAX_TOPICS and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        sock, _, _ = ready_of(h, server.address, f"/feed?topic=after-{run}")
        sock.close()
        ok, why = True, ""
    except (OSError, ConnectionError) as error:
        ok, why = False, f"{type(error).__name__}: {error}"
    checks.check("topic-cap: once they are gone, a new topic is taken again", ok, why)
    readers.close()
    server.stop()


def stalled_recovery(args, checks, h) -> None:
    server = h.Server(args, "stalled", ["--max-connections", "300"] + supported(args, ["--send-timeout", str(SEND_TIMEOUT)]))
    run = uuid.uuid4().hex[:6]
    topic, quiet = f"sr-{run}", f"sq-{run}"
    readers = Readers()
    epoch = readers.add(server.address, f"/feed?topic={topic}&policy=newest&capacity=250")["epoch"]
    # A live client that stops reading, on a topic of its own.
    stopped, _, _ = ready_of(h, server.address, f"/feed?topic={quiet}&policy=newest&capacity=64", rcvbuf=4096)
    before = server.stats()
    pad = "r" * 7999
    # A window of 1,000 messages (the default --history-messages) of 1,000 bytes.
    statuses = publish_all(h, server.address, [(f"/publish?topic={topic}", f"{run} {i} {pad}"[:1000].encode()) for i in range(1000)]
                           + [(f"/publish?topic={quiet}", f"{run} q{i} {pad}"[:7999].encode()) for i in range(100)])
    time.sleep(0.5)
    rss_before = server.rss()
    count = 100
    stalled = []
    for _ in range(count):
        sock, _ = h.ws_handshake(server.address, f"/feed?topic={topic}&since=0&epoch={epoch}", rcvbuf=4096)
        stalled.append(sock)  # never read
    connected_at = time.monotonic()
    deadline = connected_at + 10
    while server.stats()["subscribers"] < count + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    per = (server.rss() - rss_before) / count
    print(f"  (publishes {statuses}; {count} stalled recovering clients: {per / 1e3:.0f} KB of RSS each)", flush=True)
    if args.tsan:
        checks.skip("stalled-recovery: memory per client", "ThreadSanitizer build")
    else:
        checks.check("stalled-recovery: a client that asked for the whole window and never reads holds < 120 KB",
                     per < 120e3, f"{per / 1e3:.0f} KB each ({count} clients, a window of 1,000 messages of 1,000 bytes)")
    # Nothing is published from now on: they must still be closed.
    # Closed: /stats counts the eviction when the close starts (a close frame the client does not
    # take is waited for 5 s, then the connection is dropped).
    limit = SEND_TIMEOUT + 6
    deadline = connected_at + limit
    while time.monotonic() < deadline:
        stats = server.stats()
        if stats["evicted"] - before["evicted"] >= count + 1:
            break
        time.sleep(0.25)
    took = time.monotonic() - connected_at
    evicted = stats["evicted"] - before["evicted"]
    checks.check(f"stalled-recovery: {count} stalled recovering clients and a stalled live one are closed "
                 f"(/stats evicted) within {limit} s, on quiet topics", evicted >= count + 1,
                 f"after {took:.1f} s: evicted {evicted} of {count + 1}; subscribers {stats['subscribers']} (of {count + 2})")
    deadline = time.monotonic() + 15
    while (stats := server.stats())["subscribers"] > 1 and time.monotonic() < deadline:
        time.sleep(0.25)
    checks.check("stalled-recovery: a client that reads is not closed", not readers.closed and stats["subscribers"] == 1,
                 f"closed: {readers.closed[:1]}; subscribers {stats['subscribers']}")
    for sock in stalled + [stopped]:
        sock.close()
    readers.close()
    server.stop()


GROUPS = {"history-cap": history_cap, "namespace": namespace, "topic-cap": topic_cap,
          "stalled-recovery": stalled_recovery}
