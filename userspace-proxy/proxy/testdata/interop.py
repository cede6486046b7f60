"""gRPC (grpcio, C-core) and WebSocket (websockets) peers for the proxy's
interop tests (interop_python_test.go): other implementations than Go's on
either side of the proxy. Debian 12's python3-grpcio, python3-protobuf and
python3-websockets; run with /usr/bin/python3.

  interop.py grpc-client TARGET AUTHORITY   calls sockmesh.echo.Echo, prints JSON
  interop.py grpc-move TARGET AUTHORITY     a call; on a line from stdin, calls until another pod answers
  interop.py grpc-server CERT KEY           serves it over TLS, prints its port
  interop.py ws-client ADDR URI             talks to an echo WebSocket, prints JSON
  interop.py wss-server CERT KEY            serves an echo WebSocket over TLS, prints its port
"""

import asyncio
import json
import ssl
import sys
import time
from concurrent import futures

import grpc
import websockets
from google.protobuf import wrappers_pb2

SERVICE = "sockmesh.echo.Echo"
TRAILER = "x-echo-pod"


def grpc_client(target, authority):
    """Unary and streaming calls through the proxy; a failed call is
    reported with its status code and details."""
    ch = grpc.insecure_channel(target, options=[("grpc.default_authority", authority)])
    ser, de = wrappers_pb2.BytesValue.SerializeToString, wrappers_pb2.BytesValue.FromString
    out = {}
    try:
        unary = ch.unary_unary("/" + SERVICE + "/Unary", request_serializer=ser, response_deserializer=de)
        resp, call = unary.with_call(wrappers_pb2.BytesValue(value=b"ping"), timeout=30)
        out["unary"] = resp.value.decode()
        out["unaryTrailer"] = dict(call.trailing_metadata()).get(TRAILER, "")
        stream = ch.stream_stream("/" + SERVICE + "/Stream", request_serializer=ser, response_deserializer=de)
        msgs = [wrappers_pb2.BytesValue(value=b"m%d" % i + b"x" * (i * 4096)) for i in range(20)]
        call = stream(iter(msgs), timeout=30)
        out["stream"] = [m.value == msgs[i].value for i, m in enumerate(call)]
        out["streamTrailer"] = dict(call.trailing_metadata()).get(TRAILER, "")
        fail = ch.unary_unary("/" + SERVICE + "/Fail", request_serializer=ser, response_deserializer=de)
        fail(wrappers_pb2.BytesValue(value=b""), timeout=30)
    except grpc.RpcError as e:
        out["code"], out["details"] = e.code().name, e.details()
    print(json.dumps(out))


def grpc_move(target, authority):
    """One call, whose pod it prints as JSON; then, after a line on stdin
    (the proxy was told that pod terminates), calls until another pod
    answers or 10 s pass, and prints the pod and how many calls it took:
    C-core's answer to the proxy's GOAWAY."""
    ch = grpc.insecure_channel(target, options=[("grpc.default_authority", authority)])
    unary = ch.unary_unary("/" + SERVICE + "/Unary", request_serializer=wrappers_pb2.BytesValue.SerializeToString,
                           response_deserializer=wrappers_pb2.BytesValue.FromString)

    def pod():
        _, call = unary.with_call(wrappers_pb2.BytesValue(value=b"ping"), timeout=30)
        return dict(call.trailing_metadata()).get(TRAILER, "")

    out = {"first": pod()}
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    deadline, calls = time.monotonic() + 10, 0
    while True:
        out["next"], calls = pod(), calls + 1
        if out["next"] != out["first"] or time.monotonic() > deadline:
            break
    out["calls"] = calls
    print(json.dumps(out), flush=True)


def grpc_server(cert, key):
    """Echo over TLS (ALPN h2); Fail answers NOT_FOUND, as a server that
    lacks a method does."""

    def unary(req, ctx):
        ctx.set_trailing_metadata(((TRAILER, "python"),))
        return req

    def stream(reqs, ctx):
        ctx.set_trailing_metadata(((TRAILER, "python"),))
        for r in reqs:
            yield r

    def fail(req, ctx):
        ctx.abort(grpc.StatusCode.NOT_FOUND, "no such thing")

    ser, de = wrappers_pb2.BytesValue.SerializeToString, wrappers_pb2.BytesValue.FromString
    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, request_deserializer=de, response_serializer=ser),
        "Stream": grpc.stream_stream_rpc_method_handler(stream, request_deserializer=de, response_serializer=ser),
        "Fail": grpc.unary_unary_rpc_method_handler(fail, request_deserializer=de, response_serializer=ser),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=(handler,))
    with open(cert, "rb") as c, open(key, "rb") as k:
        creds = grpc.ssl_server_credentials(((k.read(), c.read()),))
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


async def ws_client(addr, uri):
    """The echo backend's first message is its report; then a text and a
    1 MiB binary message come back as sent, and the close is clean."""
    host, port = addr.rsplit(":", 1)
    out = {}
    async with websockets.connect(uri, host=host, port=int(port), max_size=None) as ws:
        out["report"] = json.loads(await ws.recv())
        await ws.send("hello")
        out["text"] = await ws.recv() == "hello"
        blob = bytes(range(256)) * 4096
        await ws.send(blob)
        out["binary"] = await ws.recv() == blob
    out["closeCode"] = ws.close_code
    print(json.dumps(out))


async def wss_server(cert, key):
    """Echoes every message; the first one it sends names the request."""

    async def echo(ws, path):
        await ws.send(json.dumps({"path": path, "host": ws.request_headers.get("Host", "")}))
        async for msg in ws:
            await ws.send(msg)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])
    async with websockets.serve(echo, "127.0.0.1", 0, ssl=ctx, max_size=None) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "grpc-client":
        grpc_client(*args)
    elif cmd == "grpc-move":
        grpc_move(*args)
    elif cmd == "grpc-server":
        grpc_server(*args)
    elif cmd == "ws-client":
        asyncio.run(ws_client(*args))
    elif cmd == "wss-server":
        asyncio.run(wss_server(*args))
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
