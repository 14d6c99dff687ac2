#!/usr/bin/env python3
"""Checks feed-server's `GET /metrics` (Prometheus text format) against `/stats`.

    Examples/.venv/bin/python Examples/clients/metrics_check.py \\
        --servers 127.0.0.1:8080,127.0.0.1:8081 --clients 10 --messages 20 --timeout 60

On every server: the content type, and each metric's name and type (`feed_subscribers`
and `feed_topics` gauges, `feed_delivered_total`, `feed_dropped_total`, `feed_evicted_total`
counters, `feed_fanout_latency_seconds` histogram). Then --clients WebSocket clients per
server join a topic of this run, --messages messages are published to it (alternating
servers), and once every client has them all:
- `feed_delivered_total` grew by at least clients × messages on each server, and the
  fan-out histogram's count by as much (one observation per message written to a client);
- each counter equals its `/stats` twin, and `feed_subscribers`, `feed_topics` too
  (read until a quiet moment makes them agree, for up to --settle seconds);
- the histogram's buckets: `le` ascending to `+Inf`, counts never decreasing, the `+Inf`
  bucket equal to `_count`, and `_count` equal to `feed_delivered_total`;
- after the clients close, `feed_subscribers` follows `/stats` back down.

The parser below is a small one for the text format (version 0.0.4): `# TYPE`/`# HELP`
lines and `name{label="value",...} value [timestamp]` samples.

Prints `PASS name` or `FAIL name: reason` per check and `N passed, N failed` last;
exits 1 if any check failed.
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import re
import sys
import time
import uuid

from websockets.asyncio.client import connect

from checks import Checks

EXPECTED = {
    "feed_subscribers": "gauge",
    "feed_topics": "gauge",
    "feed_delivered_total": "counter",
    "feed_dropped_total": "counter",
    "feed_evicted_total": "counter",
    "feed_fanout_latency_seconds": "histogram",
}
# metric name -> its /stats key
STATS_TWIN = {
    "feed_subscribers": "subscribers",
    "feed_topics": "topics",
    "feed_delivered_total": "delivered",
    "feed_dropped_total": "dropped",
    "feed_evicted_total": "evicted",
}
HISTOGRAM = "feed_fanout_latency_seconds"
CONTENT_TYPE = "text/plain; version=0.0.4"

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})?\s+(\S+)(?:\s+(-?\d+))?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


class ParseError(ValueError):
    pass


def parse_value(text: str) -> float:
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if text == "NaN":
        return math.nan
    return float(text)


def parse_labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise ParseError(f"bad labels: {text!r}")
        labels[m.group(1)] = m.group(2).replace(r"\"", '"').replace(r"\n", "\n").replace("\\\\", "\\")
        pos = m.end()
    return labels


def parse(text: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str], float]]]:
    """(family name -> type, [(sample name, labels, value)]). Raises ParseError on a bad line."""
    types: dict[str, str] = {}
    samples: list[tuple[str, dict[str, str], float]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                if parts[3] not in ("counter", "gauge", "histogram", "summary", "untyped"):
                    raise ParseError(f"line {number}: unknown type {parts[3]!r}")
                if parts[2] in types:
                    raise ParseError(f"line {number}: a second TYPE for {parts[2]}")
                types[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ParseError(f"line {number}: not a sample: {line!r}")
        try:
            value = parse_value(m.group(3))
        except ValueError:
            raise ParseError(f"line {number}: bad value {m.group(3)!r}") from None
        samples.append((m.group(1), parse_labels(m.group(2) or ""), value))
    return types, samples


def family_of(sample: str, types: dict[str, str]) -> str | None:
    if sample in types:
        return sample
    for suffix in ("_bucket", "_sum", "_count"):
        if sample.endswith(suffix) and types.get(sample[: -len(suffix)]) == "histogram":
            return sample[: -len(suffix)]
    return None


class Scrape:
    def __init__(self, server: str, timeout: float) -> None:
        status, headers, body = http_get(server, "/metrics", timeout)
        self.status = status
        self.content_type = headers.get("content-type", "")
        self.types, self.samples = parse(body.decode("utf-8")) if status == 200 else ({}, [])

    def value(self, name: str) -> float | None:
        for sample, labels, value in self.samples:
            if sample == name and not labels:
                return value
        return None

    def buckets(self, name: str) -> list[tuple[float, float]]:
        return [(parse_value(labels["le"]), value) for sample, labels, value in self.samples
                if sample == name + "_bucket" and "le" in labels]


def http_get(server: str, path: str, timeout: float) -> tuple[int, dict[str, str], bytes]:
    host, _, port = server.rpartition(":")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def stats(server: str, timeout: float) -> dict:
    status, _, body = http_get(server, "/stats", timeout)
    if status != 200:
        raise RuntimeError(f"/stats answered {status}")
    return json.loads(body)


def publish(server: str, topic: str, body: str, timeout: float) -> int:
    host, _, port = server.rpartition(":")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
    try:
        conn.request("POST", f"/publish?topic={topic}", body=body.encode(),
                     headers={"Content-Type": "text/plain; charset=utf-8"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def agree(server: str, timeout: float, settle: float) -> tuple[Scrape, dict, list[str]]:
    """Scrapes /metrics and /stats until every twin agrees or `settle` runs out;
    returns the last pair and what disagreed."""
    end = time.monotonic() + settle
    while True:
        scrape = Scrape(server, timeout)
        current = stats(server, timeout)
        wrong = [f"{name} {scrape.value(name)} vs /stats {key} {current.get(key)}"
                 for name, key in STATS_TWIN.items() if scrape.value(name) != current.get(key)]
        if not wrong or time.monotonic() > end:
            return scrape, current, wrong
        time.sleep(0.2)


def check_shape(checks: Checks, server: str, scrape: Scrape) -> None:
    checks.check(f"{server} /metrics answers 200 with {CONTENT_TYPE}",
                 scrape.status == 200 and scrape.content_type.startswith(CONTENT_TYPE),
                 f"status {scrape.status}, Content-Type {scrape.content_type!r}")
    for name, kind in EXPECTED.items():
        checks.check(f"{server} {name} is a {kind}", scrape.types.get(name) == kind,
                     f"TYPE {scrape.types.get(name)!r}")
    orphans = sorted({s for s, _, _ in scrape.samples if family_of(s, scrape.types) is None})
    checks.check(f"{server} every sample belongs to a TYPEd family", not orphans, f"untyped: {orphans[:5]}")
    for name in EXPECTED:
        if EXPECTED[name] != "histogram":
            checks.check(f"{server} {name} has one unlabelled sample", scrape.value(name) is not None,
                         "missing")


def check_histogram(checks: Checks, server: str, scrape: Scrape) -> None:
    buckets = scrape.buckets(HISTOGRAM)
    bounds = [le for le, _ in buckets]
    counts = [count for _, count in buckets]
    count = scrape.value(HISTOGRAM + "_count")
    total = scrape.value(HISTOGRAM + "_sum")
    checks.check(f"{server} {HISTOGRAM} buckets: le ascending, ending at +Inf",
                 len(buckets) >= 2 and bounds == sorted(bounds) and len(set(bounds)) == len(bounds)
                 and bounds[-1] == math.inf, f"le {bounds}")
    checks.check(f"{server} {HISTOGRAM} bucket counts never decrease",
                 all(a <= b for a, b in zip(counts, counts[1:])), f"counts {counts}")
    checks.check(f"{server} {HISTOGRAM} +Inf bucket equals _count",
                 bool(counts) and count is not None and counts[-1] == count, f"+Inf {counts[-1:]}, _count {count}")
    checks.check(f"{server} {HISTOGRAM} _sum is positive and finite",
                 total is not None and 0 < total < math.inf, f"_sum {total}")


async def run_clients(servers: list[str], clients: int, messages: int, topic: str, run: str,
                      timeout: float) -> tuple[bool, str]:
    """Clients per server on `topic`; publishes; True once every client has every message."""
    sockets = []
    counts: list[int] = []
    ready: list[asyncio.Event] = []
    done: list[asyncio.Event] = []

    async def reader(i: int, ws) -> None:
        async for raw in ws:
            frame = json.loads(raw)
            if frame.get("type") == "ready":
                ready[i].set()
            elif frame.get("type") == "message" and f'"run":"{run}"' in frame.get("body", ""):
                counts[i] += 1
                if counts[i] >= messages:
                    done[i].set()

    tasks = []
    try:
        for server in servers:
            for _ in range(clients):
                ws = await connect(f"ws://{server}/feed?topic={topic}&policy=unbounded", ping_interval=None,
                                   proxy=None, open_timeout=timeout, close_timeout=2, max_size=None)
                sockets.append(ws)
                counts.append(0)
                ready.append(asyncio.Event())
                done.append(asyncio.Event())
                tasks.append(asyncio.create_task(reader(len(sockets) - 1, ws)))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in ready)), timeout)
        for n in range(messages):
            server = servers[n % len(servers)]
            body = json.dumps({"run": run, "n": n}, separators=(",", ":"))
            status = await asyncio.to_thread(publish, server, topic, body, timeout)
            if status != 200:
                return False, f"publish {n} to {server}: {status}"
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in done)), timeout)
        except asyncio.TimeoutError:
            return False, f"messages received per client: {counts}"
        return True, ""
    except (OSError, asyncio.TimeoutError) as error:
        return False, f"{type(error).__name__}: {error}"
    finally:
        for ws in sockets:
            await ws.close()
        for task in tasks:
            task.cancel()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", required=True, help="HOST:PORT[,HOST:PORT...]")
    parser.add_argument("--clients", type=int, default=10, help="clients per server")
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--settle", type=float, default=10,
                        help="seconds for /metrics and /stats to agree")
    args = parser.parse_args()
    servers = args.servers.split(",")
    checks = Checks()
    watchdog = checks.start_watchdog(args.timeout * 3 + args.settle * 4 + 30)

    run = uuid.uuid4().hex[:12]
    topic = f"metrics-{run}"
    before = {}
    try:
        for server in servers:
            scrape, _, _ = agree(server, args.timeout, args.settle)
            check_shape(checks, server, scrape)
            before[server] = scrape
        ok, reason = asyncio.run(run_clients(servers, args.clients, args.messages, topic, run, args.timeout))
        checks.check(f"{args.clients} clients per server got {args.messages} messages each", ok, reason)
        for server in servers:
            # Clients are still open on the server until their close is read: the
            # counters settle, and are compared with /stats whatever the gauges do.
            scrape, current, wrong = agree(server, args.timeout, args.settle)
            counters = [w for w in wrong if not w.startswith(("feed_subscribers", "feed_topics"))]
            checks.check(f"{server} counters equal their /stats twins", not counters, "; ".join(counters))
            grew = (scrape.value("feed_delivered_total") or 0) - (before[server].value("feed_delivered_total") or 0)
            want = args.clients * args.messages
            checks.check(f"{server} feed_delivered_total grew by at least {want} (clients x messages)",
                         grew >= want, f"grew by {grew}")
            observed = ((scrape.value(HISTOGRAM + "_count") or 0)
                        - (before[server].value(HISTOGRAM + "_count") or 0))
            checks.check(f"{server} {HISTOGRAM} count grew by at least {want}", observed >= want,
                         f"grew by {observed}")
            check_histogram(checks, server, scrape)
            checks.check(f"{server} {HISTOGRAM} _count equals feed_delivered_total",
                         scrape.value(HISTOGRAM + "_count") == scrape.value("feed_delivered_total"),
                         f"_count {scrape.value(HISTOGRAM + '_count')}, delivered {scrape.value('feed_delivered_total')}")
        for server in servers:
            # The clients have closed: the gauges follow /stats down.
            scrape, current, wrong = agree(server, args.timeout, args.settle)
            checks.check(f"{server} feed_subscribers and feed_topics equal /stats once the clients left",
                         not wrong, "; ".join(wrong))
    except (OSError, RuntimeError, ParseError, ValueError) as error:
        checks.check("scrape", False, f"{type(error).__name__}: {error}")
    watchdog.cancel()
    print(checks.summary(), flush=True)
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
