"""Socket plumbing: the listening socket bound before the backends (listen), the
open-file limit and the connections it leaves room for (openfiles), plain-TCP
connections as bare file descriptors (fdtransport), the WebSocket framing and the
browser page on the same listener (websocket), TLS and the served certificate (tls,
certinfo), and `HOST:PORT` strings (hostport)."""
