#!/usr/bin/env python3
"""Measures feed-server's memory under the two memory attacks of issue 36 (not a check: it
prints figures, which Examples/README.md quotes).

    Examples/.venv/bin/python Examples/clients/attack_memory.py --binary Examples/.build/debug/feed-server \\
        --postgres "$FEED_POSTGRES" --attack windows     # or stalled; --server-flags for more flags

  windows  20 clients that read, on 20 topics, and --messages (20,000) messages of 7,999 bytes
           (quotes: each frame takes NIO's 16 KiB buffer, the largest message) published over
           those topics by --publishers: 330 MB of recovery windows at 1,000 per topic.
           Prints RSS and /stats historyBytes every 2 s, and the peak growth.
  stalled  one reading client on a topic, --window messages (1,000) of 1,000 bytes published to
           it, then --clients (2,000) clients that come back with since=0 (the whole window)
           behind a 4 KiB receive buffer and never read, and nothing published after: prints
           RSS every 2 s until the server closed them all (or --seconds), the peak growth and
           the growth per stalled client.

Starts its own server (default flags unless --server-flags) on a free port and stops it.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import uuid

import hardening_check as h
import process_limits as pl


def windows(args, server) -> None:
    run = uuid.uuid4().hex[:6]
    topics = [f"w{i}-{run}" for i in range(20)]
    readers = pl.Readers()
    for topic in topics:
        readers.add(server.address, f"/feed?topic={topic}&policy=newest&capacity=250")
    time.sleep(1)
    base = server.rss()
    pad = '"' * 7999
    items = [(f"/publish?topic={topics[i % 20]}", f"{run} {i:06d} {pad}"[:7999].encode()) for i in range(args.messages)]
    import threading
    done = threading.Event()
    peak = [base]

    def watch() -> None:
        started = time.monotonic()
        while not done.is_set():
            rss = server.rss()
            peak[0] = max(peak[0], rss)
            stats = server.stats()
            print(f"  t={time.monotonic() - started:5.1f}s RSS {rss / 1e6:6.1f} MB (+{(rss - base) / 1e6:5.1f}) "
                  f"historyBytes {stats.get('historyBytes', 0) / 1e6:6.1f} MB delivered {stats['delivered']}", flush=True)
            done.wait(2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    statuses = pl.publish_all(h, server.address, items, args.publishers)
    took = time.monotonic() - started
    time.sleep(2)
    done.set()
    watcher.join(5)
    peak[0] = max(peak[0], server.rss())
    stats = server.stats()
    print(f"windows: {args.messages} messages in {took:.1f} s ({statuses}); RSS {base / 1e6:.1f} -> peak "
          f"{peak[0] / 1e6:.1f} MB (+{(peak[0] - base) / 1e6:.1f} MB); historyBytes {stats.get('historyBytes')} "
          f"of {stats.get('historyLimitBytes')}; readers closed: {len(readers.closed)}")
    readers.close()


def stalled(args, server) -> None:
    run = uuid.uuid4().hex[:6]
    topic = f"s-{run}"
    readers = pl.Readers()
    epoch = readers.add(server.address, f"/feed?topic={topic}&policy=newest&capacity=250")["epoch"]
    pad = "s" * 1000
    pl.publish_all(h, server.address, [(f"/publish?topic={topic}", f"{run} {i} {pad}"[:1000].encode())
                                       for i in range(args.window)], args.publishers)
    time.sleep(1)
    base = server.rss()
    socks = []
    started = time.monotonic()
    for _ in range(args.clients):
        sock, _ = h.ws_handshake(server.address, f"/feed?topic={topic}&since=0&epoch={epoch}", rcvbuf=4096)
        socks.append(sock)
    print(f"  {args.clients} stalled clients connected in {time.monotonic() - started:.1f} s", flush=True)
    peak = base
    while time.monotonic() - started < args.seconds:
        rss = server.rss()
        peak = max(peak, rss)
        stats = server.stats()
        print(f"  t={time.monotonic() - started:5.1f}s RSS {rss / 1e6:6.1f} MB (+{(rss - base) / 1e6:5.1f}) "
              f"subscribers {stats['subscribers']} evicted {stats['evicted']}", flush=True)
        if stats["subscribers"] <= 1:
            break
        time.sleep(2)
    after = server.rss()
    print(f"stalled: {args.clients} clients for a window of {args.window} messages; RSS {base / 1e6:.1f} -> peak "
          f"{peak / 1e6:.1f} MB (+{(peak - base) / 1e6:.1f} MB, {(peak - base) / args.clients / 1e3:.0f} KB each); "
          f"all closed after {time.monotonic() - started:.0f} s: {server.stats()['subscribers'] <= 1}; RSS then {after / 1e6:.1f} MB")
    for sock in socks:
        sock.close()
    readers.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--postgres", required=True)
    parser.add_argument("--attack", choices=["windows", "stalled"], required=True)
    parser.add_argument("--server-flags", default="")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--publishers", type=int, default=8)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--logs", default="/tmp/feed-attack-memory")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.makedirs(args.logs, exist_ok=True)
    # The server's own defaults: no limit flags of hardening_check.py.
    args.plain = True
    args.tsan = False
    server = h.Server(args, args.attack)
    try:
        print(f"  ({args.binary} {args.server_flags}; log {server.log_path})", flush=True)
        {"windows": windows, "stalled": stalled}[args.attack](args, server)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
