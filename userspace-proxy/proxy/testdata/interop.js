// An HTTP/1.1 app on Node.js for the proxy's interop tests
// (interop_native_test.go): Node parses answers with llhttp, stricter
// than Go's and curl's parsers, so an answer the proxy writes a little
// wrong (framing, a body where none may be) fails here.
//
//   node interop.js ADDR HOST   prints JSON: one entry per exchange
//
// Every exchange goes over one keep-alive connection, in turn.
"use strict";
const http = require("http");

const [addr, host] = process.argv.slice(2);
const [hostname, port] = [addr.slice(0, addr.lastIndexOf(":")), addr.slice(addr.lastIndexOf(":") + 1)];
const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
const sockets = new Set();

function exchange(method, path, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ hostname, port, method, path, agent, headers: { Host: host } }, (res) => {
      sockets.add(res.socket);
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => {
        const b = Buffer.concat(chunks);
        resolve({ method, path, status: res.statusCode, bytes: b.length, body: path.startsWith("/bytes") ? "" : b.toString() });
      });
      res.on("error", reject);
    });
    req.on("error", reject);
    if (body) {
      // Chunked: written in three parts with no length given.
      for (let i = 0; i < 3; i++) req.write(body);
    }
    req.end();
  });
}

(async () => {
  const out = [];
  try {
    out.push(await exchange("GET", "/bytes/100"));
    out.push(await exchange("HEAD", "/bytes/100"));
    out.push(await exchange("GET", "/status/204"));
    out.push(await exchange("GET", "/status/304"));
    out.push(await exchange("GET", "/sse?n=3&interval=1ms"));
    out.push(await exchange("POST", "/upload", Buffer.alloc(100000, 120)));
    out.push(await exchange("GET", "/bytes/65536"));
  } catch (e) {
    out.push({ error: `${e.code || ""} ${e.message}` });
  }
  console.log(JSON.stringify({ exchanges: out, connections: sockets.size }));
  agent.destroy();
})();
