#!/usr/bin/env python3
"""A user-space TCP proxy that emulates a slow link, the way larder's `--emulate-wan` does for its home.

    bench/wanproxy.py --target 127.0.0.1:8080 [--listen 127.0.0.1:0] [--latency 30ms] [--bandwidth 200MiB/s]
    bench/wanproxy.py --selfcheck [--latency 30ms] [--bandwidth 200MiB/s] [--bytes 1GiB]

Each chunk is held for half the latency in each direction, so a request and its response together pay the
full latency once, as one larder home operation does; chunks are timed from their arrival, so a stream is
delayed, not slowed. The bandwidth is one pipe shared by both directions and all connections (what larder's
emulation does): a chunk waits until the link has carried everything queued before it. Reads are up to
256 KiB and each direction buffers at most 16 MiB, so the sender is held back (TCP back-pressure) rather
than the proxy's memory growing.

Serving: prints `listening HOST:PORT` on its first line of stdout, then runs until SIGTERM or SIGINT.
--selfcheck: pushes --bytes through the proxy from a local source to a local sink, once capped and once
uncapped, and prints JSON with the MiB/s of each, to show the proxy itself is not the bottleneck.
"""
import argparse
import asyncio
import heapq
import json
import signal
import socket
import sys
import threading
import time

CHUNK = 256 << 10
QUEUE_BYTES = 16 << 20  # in flight per direction at most
BURST = 0.005  # seconds of link time a late sender may catch up on (the event loop's timers are coarse)


def parse_duration(s):
    s = s.strip()
    for unit, mult in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if s.endswith(unit):
            return float(s[: -len(unit)]) * mult
    return float(s)


def parse_size(s):
    s = s.strip()
    if s.endswith("/s"):
        s = s[:-2]
    units = {"kib": 1 << 10, "k": 1 << 10, "mib": 1 << 20, "m": 1 << 20, "gib": 1 << 30, "g": 1 << 30, "b": 1}
    low = s.lower()
    for unit in sorted(units, key=len, reverse=True):
        if low.endswith(unit):
            return int(float(low[: -len(unit)]) * units[unit])
    return int(float(s))


class Timer:
    """Wakes coroutines at a due time (loop.time(), i.e. time.monotonic()) to within tens of µs. The event
    loop's own timers are rounded up to whole milliseconds by epoll, which would make a 1 ms link about
    3 ms: a thread sleeps precisely on a heap of due times and wakes the loop."""

    def __init__(self, loop):
        self.loop = loop
        self.heap = []
        self.seq = 0
        self.cv = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    async def sleep_until(self, due):
        if due <= time.monotonic():
            return
        fut = self.loop.create_future()
        with self.cv:
            heapq.heappush(self.heap, (due, self.seq, fut))
            self.seq += 1
            self.cv.notify()
        await fut

    def _run(self):
        while True:
            with self.cv:
                while not self.heap:
                    self.cv.wait()
                due, _, fut = self.heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self.cv.wait(wait)
                    continue
                heapq.heappop(self.heap)
            self.loop.call_soon_threadsafe(_wake, fut)


def _wake(fut):
    if not fut.done():
        fut.set_result(None)


class Link:
    """The shared pipe: transfers queue behind each other at `bandwidth` bytes/s (None: unlimited)."""

    def __init__(self, bandwidth):
        self.bandwidth = bandwidth
        self.free_at = 0.0
        self.bytes = 0

    async def transfer(self, n):
        self.bytes += n
        if not self.bandwidth:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        # A token bucket BURST seconds deep: time lost oversleeping is made up, idle time is not banked.
        self.free_at = max(self.free_at, now - BURST) + n / self.bandwidth
        wait = self.free_at - now
        if wait > 0:
            await asyncio.sleep(wait)


async def pump(reader, writer, one_way, link, timer):
    """Copy reader to writer, each chunk released one_way seconds after it arrived, through the link."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()
    queued = [0]
    room = asyncio.Event()
    room.set()

    async def receive():
        try:
            while True:
                await room.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                queue.put_nowait((loop.time() + one_way, data))
                queued[0] += len(data)
                if queued[0] >= QUEUE_BYTES:
                    room.clear()
        except (ConnectionError, OSError):
            pass
        finally:
            queue.put_nowait(None)

    async def send():
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                due, data = item
                queued[0] -= len(data)
                if queued[0] < QUEUE_BYTES:
                    room.set()
                await timer.sleep_until(due)
                await link.transfer(len(data))
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass

    rx = asyncio.ensure_future(receive())
    try:
        await send()
    finally:
        rx.cancel()


async def serve(listen, target, latency, bandwidth, ready=None, stop=None):
    link = Link(bandwidth)
    timer = Timer(asyncio.get_running_loop())
    one_way = latency / 2
    thost, tport = target
    handlers = set()

    async def handle(creader, cwriter):
        handlers.add(asyncio.current_task())
        try:
            ureader, uwriter = await asyncio.open_connection(thost, tport, limit=4 * CHUNK)
        except OSError:
            cwriter.close()
            return
        for w in (cwriter, uwriter):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.gather(pump(creader, uwriter, one_way, link, timer),
                                 pump(ureader, cwriter, one_way, link, timer))
        except asyncio.CancelledError:
            pass  # shutting down; returning normally keeps asyncio's stream callback quiet
        finally:
            for w in (cwriter, uwriter):
                w.close()
            handlers.discard(asyncio.current_task())

    server = await asyncio.start_server(handle, listen[0], listen[1], limit=4 * CHUNK)
    host, port = server.sockets[0].getsockname()[:2]
    if ready is not None:
        ready(host, port)
    else:
        print(f"listening {host}:{port}", flush=True)
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


def hostport(s):
    host, _, port = s.rpartition(":")
    return host or "127.0.0.1", int(port)


def selfcheck_once(latency, bandwidth, nbytes):
    """MiB/s of nbytes pushed through a proxy in this process, from a source thread to a sink."""
    src = socket.socket()
    src.bind(("127.0.0.1", 0))
    src.listen(1)
    sport = src.getsockname()[1]

    def source():
        conn, _ = src.accept()
        buf = memoryview(bytes(4 << 20))
        left = nbytes
        try:
            while left > 0:
                n = min(left, len(buf))
                conn.sendall(buf[:n])
                left -= n
        finally:
            conn.close()

    threading.Thread(target=source, daemon=True).start()
    got = {}
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def on_ready(host, port):
        got["port"] = port
        ready.set()

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve(("127.0.0.1", 0), ("127.0.0.1", sport), latency, bandwidth, on_ready, stop))
        loop.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    if not ready.wait(10):
        raise RuntimeError("proxy did not start")
    c = socket.create_connection(("127.0.0.1", got["port"]))
    buf = bytearray(4 << 20)
    mv = memoryview(buf)
    total, start, deadline = 0, time.monotonic(), time.monotonic() + 120
    while total < nbytes and time.monotonic() < deadline:
        n = c.recv_into(mv)
        if n == 0:
            break
        total += n
    elapsed = time.monotonic() - start
    c.close()
    loop.call_soon_threadsafe(stop.set)
    t.join(10)
    src.close()
    return {"bytes": total, "seconds": round(elapsed, 3), "MiB_s": round(total / elapsed / (1 << 20), 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--target")
    ap.add_argument("--latency", default="30ms", help="round trip added to each request and its response")
    ap.add_argument("--bandwidth", default="200MiB/s", help="shared by both directions; 0 is unlimited")
    ap.add_argument("--selfcheck", action="store_true")
    ap.add_argument("--bytes", default="1GiB", help="--selfcheck: how much to push through")
    a = ap.parse_args()
    latency, bandwidth = parse_duration(a.latency), parse_size(a.bandwidth) or None
    if a.selfcheck:
        nbytes = parse_size(a.bytes)
        out = {
            "latency_s": latency,
            "bandwidth_MiB_s": bandwidth and bandwidth / (1 << 20),
            "capped": selfcheck_once(latency, bandwidth, nbytes),
            "uncapped": selfcheck_once(0.0, None, nbytes),
        }
        print(json.dumps(out))
        return
    if not a.target:
        sys.exit("wanproxy: --target HOST:PORT is required")
    try:
        asyncio.run(serve(hostport(a.listen), hostport(a.target), latency, bandwidth))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
