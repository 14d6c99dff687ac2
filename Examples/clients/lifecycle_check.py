#!/usr/bin/env python3
"""Checks the feed's life cycle against one freshly started feed-server (broadcast hub).

    Examples/.venv/bin/python Examples/clients/lifecycle_check.py \\
        --server 127.0.0.1:8080 --postgres postgres://postgres@127.0.0.1:5432/feed \\
        --pause Examples/scripts/pg-pause.sh

In order, each a check:
  1. before the first client, no connection named feed-server-listen is in pg_stat_activity;
  2. a client gets `ready` first, and then LISTEN is there;
  3. a message published after `ready` reaches it;
  4. a second client first gets that message again (replay), with the same seq;
  5. with PostgreSQL stopped (--pause stop), POST /publish answers 503, and the server keeps serving /stats;
  6. with it started again, `resync` reaches both clients within 30 s;
  7. a message published after `resync` reaches both clients;
  8. after the last client leaves, the LISTEN connection is still there 3 s later and gone within 12 s;
  9. a `.bounded` client that stops reading (4 KiB receive buffer) is evicted: /stats counts it within
     20 s, and when it reads again it finds close code 1013 behind its backlog; one that never reads
     again is disconnected within 15 s of its eviction (/stats `connections`).
Prints PASS/FAIL lines and `N passed, N failed` last; exits 1 if any failed.
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import socket
import subprocess
import sys
import time
import uuid

import websockets
from websockets.asyncio.client import connect

from checks import Checks



def listen_connections(postgres: str) -> int:
    out = subprocess.run(
        ["psql", postgres, "-Atc",
         "select count(*) from pg_stat_activity where application_name = 'feed-server-listen'"],
        capture_output=True, text=True, timeout=20)
    if out.returncode != 0:
        raise RuntimeError(f"psql failed: {out.stderr.strip()}")
    return int(out.stdout.strip() or "0")


def request(server: str, method: str, path: str, body: str | None = None) -> tuple[int, str]:
    host, port = server.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=15)
    try:
        conn.request(method, path, body=body.encode() if body is not None else None)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


async def next_frame(ws, timeout: float) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def wait_for(ws, predicate, timeout: float) -> dict | None:
    """The first frame that satisfies predicate within timeout (other frames are skipped)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            frame = await next_frame(ws, left)
        except asyncio.TimeoutError:
            return None
        if predicate(frame):
            return frame
    return None


def is_message(body: str):
    return lambda f: f.get("type") == "message" and f.get("body") == body


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Checks the feed's life cycle against one freshly started feed-server.")
    parser.add_argument("--server", required=True)
    parser.add_argument("--postgres", required=True)
    parser.add_argument("--pause", required=True, help="pg-pause.sh")
    parser.add_argument("--only-eviction", action="store_true", help="run check 9 alone")
    return parser.parse_args()


async def main(args: argparse.Namespace) -> int:
    checks = Checks()
    run = uuid.uuid4().hex[:8]
    if args.only_eviction:
        await eviction(args, checks, run)
        print(checks.summary())
        return 0 if checks.failed == 0 else 1
    url = f"ws://{args.server}/feed?policy=newest&capacity=64"

    checks.check("no LISTEN connection before the first client", listen_connections(args.postgres) == 0,
                 f"{listen_connections(args.postgres)} found")

    async with connect(url, open_timeout=15) as first:
        frame = await next_frame(first, 30)
        checks.check("ready is the first frame", frame.get("type") == "ready", f"first frame {frame}")
        checks.check("LISTEN connection exists once a client is ready", listen_connections(args.postgres) >= 1)

        body_a = json.dumps({"run": run, "n": "a"})
        status, _ = request(args.server, "POST", "/publish", body_a)
        got = await wait_for(first, is_message(body_a), 10)
        checks.check("a message published after ready arrives", status == 200 and got is not None,
                     f"publish status {status}, frame {got}")

        async with connect(url, open_timeout=15) as second:
            frames = [await next_frame(second, 10)]
            replay = await wait_for(second, lambda f: f.get("type") == "message", 10)
            checks.check("a new client gets the last message again, same seq",
                         frames[0].get("type") == "ready" and replay is not None and got is not None
                         and replay.get("body") == body_a and replay.get("seq") == got.get("seq"),
                         f"first {frames[0]}, then {replay}, original {got}")

            subprocess.run(["bash", args.pause, "stop"], check=True, timeout=60, capture_output=True)
            try:
                status, text = request(args.server, "POST", "/publish", json.dumps({"run": run, "n": "lost"}))
                stats_status, _ = request(args.server, "GET", "/stats")
                checks.check("publish answers 503 while PostgreSQL is down; the server keeps serving",
                             status == 503 and stats_status == 200, f"publish {status} {text!r}, stats {stats_status}")
            finally:
                subprocess.run(["bash", args.pause, "start"], check=True, timeout=60, capture_output=True)
            came_back = time.monotonic()
            r1 = await wait_for(first, lambda f: f.get("type") == "resync", 30)
            r2 = await wait_for(second, lambda f: f.get("type") == "resync", max(1, 30 - (time.monotonic() - came_back)))
            checks.check("resync reaches every client within 30 s of PostgreSQL's return",
                         r1 is not None and r2 is not None,
                         f"first {'got' if r1 else 'missed'} it, second {'got' if r2 else 'missed'} it")

            body_b = json.dumps({"run": run, "n": "b"})
            deadline = time.monotonic() + 15
            while (status := request(args.server, "POST", "/publish", body_b)[0]) != 200 and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            g1 = await wait_for(first, is_message(body_b), 10)
            g2 = await wait_for(second, is_message(body_b), 10)
            checks.check("after resync, new messages reach every client", g1 is not None and g2 is not None,
                         f"publish {status}; first {g1}, second {g2}")

    # Both clients are gone: the LISTEN stays for 5 s, then goes.
    left = time.monotonic()
    await asyncio.sleep(3)
    still = listen_connections(args.postgres)
    gone_after = None
    while time.monotonic() - left < 12:
        if listen_connections(args.postgres) == 0:
            gone_after = time.monotonic() - left
            break
        await asyncio.sleep(0.25)
    checks.check("LISTEN outlives the last client by about 5 s, then goes (stopAfter)",
                 still >= 1 and gone_after is not None,
                 f"at 3 s: {still} connection(s); gone after {gone_after} s")
    print(f"  (LISTEN gone {gone_after:.1f} s after the last client left)" if gone_after else "")

    await eviction(args, checks, run)

    print(checks.summary())
    return 0 if checks.failed == 0 else 1


def stats(server: str) -> dict:
    return json.loads(request(server, "GET", "/stats")[1])


async def stall_until_evicted(args, run: str, before: int, pad_bytes: int = 2000) -> tuple[int, float, float]:
    """Publishes more than a stopped `.bounded` client's socket holds, then a message every half
    second (the broadcast hub's library evicts at the send that finds it full for 10 s) until
    /stats counts one more eviction, at most 20 s. Returns (evicted, seconds since the first
    publish, seconds of the first burst)."""
    pad = "x" * pad_bytes
    # Its queue fills during the publishing, which takes seconds under ThreadSanitizer:
    # the 10 s are counted from the first publish (an eviction before 9 s of that is early).
    started = time.monotonic()
    for n in range(150):  # about 300 KB: more than the socket buffers hold (about 150 KB)
        request(args.server, "POST", "/publish", json.dumps({"run": run, "n": n, "pad": pad}))
    stopped = time.monotonic()
    evicted = before
    n = 150
    while time.monotonic() - stopped < 20 and evicted <= before:
        await asyncio.sleep(0.5)
        request(args.server, "POST", "/publish", json.dumps({"run": run, "n": n, "pad": pad}))
        n += 1
        evicted = stats(args.server).get("evicted", 0)
    return evicted, time.monotonic() - started, stopped - started


def stalling_connect(server: str, capacity: int, close_timeout: float):
    """A `.bounded(capacity)` client whose 4 KiB receive buffer (set before connecting, so the
    advertised window stays small) fills at once when it stops reading."""
    host, port = server.split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    return connect(f"ws://{server}/feed?policy=bounded&capacity={capacity}", sock=sock, max_queue=1,
                   open_timeout=15, close_timeout=close_timeout)


async def eviction(args, checks: Checks, run: str) -> None:
    before = stats(args.server).get("evicted", 0)
    async with stalling_connect(args.server, 4, close_timeout=5) as ws:
        frame = await next_frame(ws, 30)
        if not checks.check("a bounded client gets ready", frame.get("type") == "ready", f"first frame {frame}"):
            return
        # Stop reading.
        evicted, took, burst = await stall_until_evicted(args, run, before)
        checks.check("a bounded client that stopped reading is evicted (10 s full, then /stats counts it)",
                     evicted > before and took >= 9,
                     f"evicted {before} -> {evicted} {took:.1f} s after the first publish ({burst:.1f} s of publishing)")
        code = None
        frames = 0
        resumed = time.monotonic()
        detail = ""
        try:
            while True:
                await asyncio.wait_for(ws.recv(), 20)
                frames += 1
        except websockets.exceptions.ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            # Without a close frame: who ended the connection, and how long the backlog took
            # (the server gives the close frame 5 s from the eviction, then closes the channel).
            detail = f" ({type(closed).__name__}: {closed}; sent {closed.sent.code if closed.sent else None})"
        except asyncio.TimeoutError:
            code = "timeout"
        checks.check("reading again, it finds close code 1013 behind its backlog", code == 1013,
                     f"close code {code}{detail} after {frames} frames, {time.monotonic() - resumed:.2f} s of reading, "
                     f"eviction seen {took:.1f} s after the first publish")
    status, _ = request(args.server, "GET", "/stats")
    checks.check("the server keeps serving after an eviction", status == 200, f"/stats {status}")
    await never_reads(args, checks, run)


NEVER_READS = "an evicted client that never reads again is disconnected within 15 s"


async def never_reads(args, checks: Checks, run: str) -> None:
    """An evicted client that never reads again does not keep its connection: the server gives
    its close frame 5 s to get out, then closes (/stats `connections`, the TCP connections open
    now, falls back to what it was before the client came)."""
    baseline = stats(args.server).get("connections")
    if not isinstance(baseline, int):
        checks.skip(NEVER_READS, "/stats has no `connections`")
        return
    before = stats(args.server).get("evicted", 0)
    # Messages of 7,000 bytes and a capacity of 16: the server's writes then hold more than
    # its channel's high-water mark, so no later frame gets through while the client stalls.
    async with stalling_connect(args.server, 16, close_timeout=1) as ws:
        await next_frame(ws, 30)
        evicted, _, _ = await stall_until_evicted(args, run, before, pad_bytes=7000)
        if evicted <= before:
            checks.check(NEVER_READS, False, "it was not evicted")
            return
        evicted_at = time.monotonic()
        connections = baseline + 1
        while time.monotonic() - evicted_at < 15:
            connections = stats(args.server)["connections"]
            if connections <= baseline:
                break
            await asyncio.sleep(0.5)
        took = time.monotonic() - evicted_at
        print(f"  (a client that never reads: evicted, then /stats connections {connections} after {took:.1f} s; "
              f"{baseline} before it came)", flush=True)
        checks.check(NEVER_READS, connections <= baseline,
                     f"/stats connections {connections} {took:.1f} s after its eviction (it was {baseline} before it came)")


if __name__ == "__main__":
    try:
        arguments = parse_args()
        sys.exit(asyncio.run(asyncio.wait_for(main(arguments), 180)))
    except asyncio.TimeoutError:
        print("FAIL lifecycle check: timed out after 180 s")
        print("0 passed, 1 failed")
        sys.exit(1)
    except Exception as error:  # a refused connection, a closed socket: a failure, said in one line
        print(f"FAIL lifecycle check: {type(error).__name__}: {' '.join(str(error).split())}")
        print("0 passed, 1 failed")
        sys.exit(1)
