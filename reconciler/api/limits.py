"""The listener's bounds, in one place: bodies, timeouts, connections a peer and in all, the health pool, event
streams, refusals audited; and the scope's state keys by which the protocol tells the guard who a connection is.

Read by the guard (``reconciler.api.guard``), the protocol (``reconciler.api.protocol``), the listener
(``reconciler.api.listener``), the refusals' account (``reconciler.api.refusals``) and the OpenAPI document; the
tests that attack the listener take their figures from here. Standard library only (no imports at all).
"""

MAX_BODY = 64 << 10  # a request body at most, chunked or not (413 past it)

# The listener's bounds. A scrape, a call of the API or MCP is one short request; these leave room for many at once
# and none for a client that holds connections open doing nothing.
HEAD_TIMEOUT_S = 10.0  # from connecting (or the previous answer) to a complete request head
BODY_TIMEOUT_S = 10.0  # to receive the whole body once the head is in
KEEP_ALIVE_S = 5.0  # an idle kept-alive connection is closed after this
MAX_CONNECTIONS = 256  # open connections at most (fewer under a low open-file limit: ``connection_cap``)
# Connections the kernel completes before the listener accepts them (capped by net.core.somaxconn). Past it the
# kernel drops a new connection's SYN and the client sends it again a second or more later: with 128, clients that
# reconnected as fast as they were refused kept it full, and a health check waited up to 3 s to be accepted.
BACKLOG = 1024
MAX_HEAD_BYTES = 16 << 10  # a request line and headers larger than this are refused by h11
RESTARTS_PER_HOUR = 5  # listener restarts before the loop gives up and exits 1
# An address another process holds (a local user bound the port while the loop was down): bound again after this,
# doubling up to the most; the loop reconciles meanwhile and never exits for it.
BIND_RETRY_BASE_S = 1.0
BIND_RETRY_MAX_S = 30.0
# A client that does not take its answer: once the bytes waiting to be sent to it have not gone down for this long,
# its connection is dropped (an answer is one write; a client that reads slowly but steadily is never cut off).
WRITE_TIMEOUT_S = 10.0
# A peer is a local user (the uid owning the connecting socket, whatever loopback address it connects from) or a
# remote address (an IPv6 one by its /64). Each holds at most this share of the connections (``peer_cap``).
PEER_SHARE = 8
# /healthz and /metrics have a small pool of their own: a connection past the bounds above may still ask one of
# them, once, within HEALTH_TIMEOUT_S (its head and its answer), at most HEALTH_PER_PEER of them a peer.
HEALTH_SLOTS = 16
HEALTH_PER_PEER = 2
HEALTH_TIMEOUT_S = 2.0
# Event streams (GET /mcp): open at most, in all and per token.
MAX_STREAMS = 32
MAX_STREAMS_PER_TOKEN = 16
# Refusals (401, 403, 408, 413, 421, 429, a bad header, type or body) are all counted; each peer's are logged and
# audited at most REFUSALS_AUDITED a window, the rest summed up in one record and one line when the window ends.
REFUSALS_AUDITED = 10
REFUSAL_WINDOW_S = 60.0
REFUSAL_PEERS = 256  # peers tracked at once; past them, refusals share one "other peers" account
# The scope's state keys by which the protocol tells the Guard who a connection's peer is and which pool it is in.
STATE_PEER = "reconciler.peer"
STATE_POOL = "reconciler.pool"
# And by which the Guard tells the routes which token a request came with (its name is the audit trail's caller).
STATE_CALLER = "reconciler.caller"
