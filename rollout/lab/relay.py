"""A byte relay between a listening endpoint and a target endpoint (TCP or unix socket).

Why it exists: each lab node lives in its own network namespace, where the host's 127.0.0.1 (on
which the API server listens) is not reachable, and the API server must not listen on any other
host address. So the lab runs two relays per node path:

* on the host, ``unix:<labdir>/apiserver.sock -> tcp:127.0.0.1:<apiserver port>`` (one per lab);
* inside each node's network namespace,
  ``tcp:127.0.0.1:<apiserver port> -> unix:<labdir>/apiserver.sock``,

so that inside a node ``https://127.0.0.1:<port>`` reaches the real API server exactly as it does on
the host (the serving certificate carries 127.0.0.1). TLS passes through untouched: the relay only
copies bytes. Run as ``python -m rollout.lab.relay --listen EP --connect EP [--ready-file F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    """``tcp:HOST:PORT`` or ``unix:PATH``."""

    kind: str
    host: str = ""
    port: int = 0
    path: str = ""

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """Parse ``tcp:HOST:PORT`` or ``unix:PATH``.

        Raises:
            ValueError: the text is neither.
        """
        kind, _, rest = text.partition(":")
        if kind == "unix" and rest:
            return cls("unix", path=rest)
        if kind == "tcp":
            host, _, port = rest.rpartition(":")
            if host and port.isdigit():
                return cls("tcp", host=host, port=int(port))
        raise ValueError(f"not an endpoint (tcp:HOST:PORT or unix:PATH): {text!r}")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def _open(ep: Endpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if ep.kind == "unix":
        return await asyncio.open_unix_connection(ep.path)
    return await asyncio.open_connection(ep.host, ep.port)


async def serve(listen: Endpoint, target: Endpoint, ready_file: str | None = None) -> None:
    """Accept connections on ``listen`` and copy bytes both ways to a new ``target`` connection."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            tr, tw = await _open(target)
        except OSError:
            w.close()
            return
        await asyncio.gather(_pipe(r, tw), _pipe(tr, w))
        for x in (w, tw):
            x.close()

    server: asyncio.AbstractServer
    if listen.kind == "unix":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(listen.path)
        server = await asyncio.start_unix_server(handle, listen.path)
    else:
        server = await asyncio.start_server(handle, listen.host, listen.port, reuse_address=True)
    if ready_file:
        with open(ready_file, "w") as f:
            f.write(f"{os.getpid()}\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    if listen.kind == "unix":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(listen.path)


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m rollout.lab.relay --listen EP --connect EP``."""
    p = argparse.ArgumentParser(prog="rollout.lab.relay", description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, type=Endpoint.parse)
    p.add_argument("--connect", required=True, type=Endpoint.parse)
    p.add_argument("--ready-file")
    a = p.parse_args(argv)
    asyncio.run(serve(a.listen, a.connect, a.ready_file))


if __name__ == "__main__":
    main()
