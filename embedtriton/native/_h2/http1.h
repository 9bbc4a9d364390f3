/* embedtriton._h2.HttpServer: the REST endpoint's HTTP/1.1, served in C.
 *
 * A sibling of the gRPC transport (h2.h) rather than a protocol inside its loop: _h2's Conn and
 * Stream are shaped by nghttp2 (a session per connection, streams with flow control), an HTTP/1.1
 * connection is a byte queue and an ordered list of requests. What is shared: the dlopen()ed
 * OpenSSL and its context setup (tls_context), the listening socket (listen_on), OutBuf, the
 * clock and the counters' macros.
 *
 * One IO thread runs epoll over the listener, an eventfd and the connections. Each iteration:
 *   1. epoll_wait with the GIL released;
 *   2. read (a bounded amount per connection) and parse (no GIL): complete requests are queued on
 *      their connection, in order (keep-alive and pipelining);
 *   3. take the GIL once: hand new requests to Python (on_request(call, method, url, headers,
 *      body, names)), refusals (on_refused(call, status, message, url)), and drop the calls of
 *      requests that are over;
 *   4. move what respond()/send() queued (from any thread) to the sockets, the answers in request
 *      order: only the oldest request's answer is written, the others wait their turn;
 *   5. timers (request, idle and TLS handshake timeouts, accept pauses), closing.
 *
 * Limits (as the asyncio endpoint had them): max_header_bytes (the URL and the header names and
 * values, 431; the raw head, whitespace and line ends included, at most head_raw_limit() bytes,
 * 431 too), max_body_bytes (Content-Length, 413), chunked bodies refused (411), anything
 * else malformed (400), request_timeout (a request begun must arrive whole, else 408 after the
 * answers before it, then close), idle_timeout, max_connections (an idle connection makes room,
 * one that never spoke first), backpressure: a connection is read no further while it has
 * MAX_PIPELINED requests unanswered, HELD_BYTES of requests not yet handed over, or BUF_HIGH bytes
 * of answers its client has not read; at most MAX_INFLIGHT of its requests are with Python at
 * once, and none is handed over while its answers are over BUF_HIGH. Across connections,
 * max_buffered_bytes bounds the request bytes the server holds (h1_incoming: what input buffers
 * grew to beyond their first H1_READ, for requests arriving, and the requests read but not handed
 * over); the request that would take them over it is refused (503, after the answers before it,
 * then close) and what its connection held is freed at once.
 *
 * A client that leaves (its connection closed, reset, or shut for writing by the client) before
 * a request it sent was answered: the request's call is "lost" and its on_gone is called in the
 * next dispatch (the endpoint cancels the request's work in Triton); an answer that still comes
 * is written if the connection can take it (a client that only shut its sending side reads it).
 *
 * Lifetimes: an HReq exists from its parse until its answer is written (or its connection
 * closes). It owns one reference to its HttpCall (created at dispatch, with the GIL), released
 * in the next dispatch after the HReq is freed (the IO thread frees it without the GIL).
 * HttpCall.req points back and is cleared under srv->mu before the HReq is freed, so a late
 * respond() from another thread finds NULL and returns False. HReq.conn is cleared under mu too.
 *
 *   http1_parse.c   the request parser (no Python, no IO)
 *   http1_conn.c    connections: reading, parsing into requests, writing
 *   http1_accept.c  connections: accepting, closing, timers
 *   http1_input.c   a connection's input buffer, and max_buffered_bytes across connections
 *   http1_loop.c    the IO thread: its loop, dispatch to Python, stopping
 *   http1_server.c  the HttpServer type
 *   http1_call.c    the HttpCall type, http_reply (h2_reply.h) and on_gone
 */
#ifndef EMBEDTRITON_HTTP1_H
#define EMBEDTRITON_HTTP1_H

#include "h2.h"

#define MAX_PIPELINED 64 /* requests unanswered on one connection before it is not read */
#define MAX_INFLIGHT 4   /* of them, handed to Python at once */
#define HELD_BYTES                                                                            \
  (1024 * 1024)               /* bytes of parsed requests not yet handed over, per connection \
                               */
#define BUF_HIGH (256 * 1024) /* answer bytes a client has not read before it is not read */
#define H1_READ (64 * 1024)   /* bytes one recv() asks for */
#define MAX_FIELDS 4096       /* header fields of one request */

/* A connection's input buffer: H1_READ bytes at first, grown (doubling, within max_buffered_bytes)
 * only when less than H1_READ_MIN of it is free for the next read (or than the rest of a body, if
 * that is less: a request that fits in the first buffer never grows it). */
#define H1_READ_MIN (8 * 1024)

/* The raw head (the request line and the header lines as received, whitespace and line ends
 * included) is refused (431) past this many bytes, checked as it arrives: max_header_bytes counts
 * only the URL and the header names and trimmed values, so without it a client could send endless
 * lines of spaces. Every head within max_header_bytes fits: its framing is the method, " ", " "
 * and "HTTP/1.1" on the request line, ": " and a CRLF per field, and a last CRLF, with at most
 * min(max_hdr, MAX_FIELDS) fields (each counts a byte of name at least); RAW_HEAD_SLACK leaves
 * room for a method of up to 498 bytes. */
#define RAW_HEAD_SLACK 512
static inline size_t head_raw_limit(size_t max_hdr)
{
  return max_hdr + 4 * (max_hdr < MAX_FIELDS ? max_hdr : MAX_FIELDS) + RAW_HEAD_SLACK;
}

/* ---- http1_parse.c -------------------------------------------------------- */

typedef struct {
  uint32_t off, len; /* in the request's head */
} Span;

/* One request head being parsed: lines are parsed as they arrive. Offsets are from the head's
 * first byte (the connection's input is compacted to it). */
typedef struct {
  size_t scan;    /* where the next line starts */
  size_t counted; /* URL + names + values so far (as max_header_bytes counts them) */
  int have_line;  /* the request line was parsed */
  Span method, url;
  int minor;    /* HTTP/1.<minor> */
  Span* fields; /* name, value, name, value, ... */
  size_t nfields, capfields;
  int64_t length; /* Content-Length, -1 without one */
  int chunked, conn_close, conn_keep_alive;
} Head;

/* Parse the lines of buf[0:len) from h->scan on. Returns 1 when the head is complete (h->scan is
 * then the body's first byte), 0 when it needs more bytes, or an HTTP status (400, 411, 413, 431)
 * with its message in err. A head still arriving is all of buf: its bytes, a partial line
 * included, are held to head_raw_limit(max_hdr). */
int head_parse(Head* h, const uint8_t* buf, size_t len, size_t max_hdr, size_t max_body, char* err,
               size_t errsize);
void head_reset(Head* h);

/* ---- types ---------------------------------------------------------------- */

typedef struct HttpServerObject HttpServerObject;
typedef struct HttpCallObject HttpCallObject;
typedef struct HConn HConn;
typedef struct HReq HReq;

struct HReq {
  HReq* next;           /* the connection's requests, in order */
  HConn* conn;          /* NULL once the connection is gone (written under mu) */
  HttpCallObject* call; /* strong reference, from dispatch on (GIL) */
  /* the request (IO thread; freed at dispatch): the head's bytes, then the body */
  uint8_t* blob;
  size_t head_len, body_len;
  Head head; /* its spans point into blob */
  int keep_alive;
  int refused; /* an HTTP status: not a request but why the connection is read no further */
  char* refusal;
  int dispatched;
  void* prepared; /* (dispatch) the fast handler's state between its prepare() and submit() */
  /* the answer: guarded by srv->mu */
  OutBuf *qh, *qt;
  int answered; /* respond() or begin() was called */
  int done;     /* the answer is complete */
};

struct HConn {
  HttpServerObject* srv;
  int fd;
  SSL* ssl;
  int handshaking, dead, events;
  int eof;     /* the client shut its side: its requests are answered, then the connection closes */
  int stopped; /* no more requests are read (refused, Connection: close, eof) */
  int spoke;   /* it sent a byte */
  int paused;  /* not read for backpressure */
  int pending_in; /* read budget used up: read again next iteration */
  unsigned served;
  HConn *pprev, *pnext; /* srv->pend */
  /* input */
  uint8_t* in;
  size_t inoff, inlen, incap; /* unparsed input is in[inoff:inlen) */
  int in_request;             /* a request's bytes arrived, not all of them yet */
  int in_body;
  Head head;
  size_t body_want;
  double req_deadline;
  /* requests, oldest first; the first one's answer is the one being written */
  HReq *qhead, *qtail;
  int nreq, ninflight;
  size_t held; /* bytes of requests not yet handed to Python */
  /* output: the answers' bytes taken from the oldest request, being written */
  OutBuf *wh, *wt;
  int close_after;     /* an answer without keep-alive was taken: close once it is written */
  int refused_close;   /* that answer refused the request: the client may still be sending it */
  double linger_until; /* > 0: answered and shut for writing; what arrives is read and dropped */
  size_t buffered;     /* answer bytes queued (in its requests' queues and out): under mu */
  int dirty;           /* under mu */
  int aborted;         /* under mu: HttpCall.abort() asked to close it now */
  int writer; /* under mu: a thread is writing to it (h1_flush, or h1_reply's direct write) */
  HConn* dnext;
  double accepted_at, idle_since;
  char peer[PEER_LEN];
  HConn *prev, *next;
};

struct HttpServerObject {
  PyObject_HEAD
  PyObject *on_request, *on_refused;
  const H1FastOps* fast; /* a handler in C for some requests (set_fast(), h2_reply.h) (GIL) */
  PyObject* fast_ctx;
  int port, listen_fd, epfd, evfd, reserve_fd;
  pthread_t thread;
  int started, joined, thread_ref, names;
  pthread_mutex_t join_mu;
  PyThreadState* tstate;
  SSL_CTX* ssl_ctx;
  /* limits */
  int max_conns;
  size_t max_hdr, max_body;
  size_t max_buffered; /* request bytes held across connections (h1_incoming) */
  double idle_timeout, request_timeout, sweep_every;
  /* guarded by mu */
  pthread_mutex_t mu;
  HConn* dirty_head;
  int wake_pending, in_dispatch, stop_req;
  HttpCallObject** gone; /* references handed back by h1_reply: released by dispatch (GIL) */
  size_t ngone, capgone;
  int io_done;      /* the IO thread has ended: h1_reply releases them itself */
  int gone_waiting; /* (IO thread) apply_dirty saw some: the next epoll_wait does not block */
  double grace;
  /* IO thread only */
  HConn* conns;
  int nconns;
  HConn* pend;
  unsigned iter;
  double accept_at, now, next_sweep, deadline;
  int stopping, hard;
  HReq** todo; /* requests to hand over this iteration */
  size_t ntodo, captodo;
  HttpCallObject** done; /* calls to release (their requests are over) */
  size_t ndone, capdone;
  HttpCallObject** lost; /* calls whose clients left unanswered: on_gone is called (borrowed: */
  size_t nlost, caplost; /*   their requests, or done, hold them until dispatch has called it) */
  HConn** work;
  size_t capwork;
  HttpServerObject* reg_next;
  /* counters (relaxed atomics) */
  uint64_t n_accepted, n_refused, n_emfile, n_idle_closed, n_evicted, n_requests, n_timeouts,
      n_paused, n_written_now, n_budget; /* n_budget: requests refused for max_buffered_bytes */
  int64_t n_open, g_paused, g_held, g_buffered; /* gauges: now paused, bytes held and buffered */
  int64_t g_input; /* gauge (IO thread): what input buffers grew to beyond their first H1_READ */
};

struct HttpCallObject {
  PyObject_HEAD
  HttpServerObject* srv; /* strong */
  HReq* req;             /* guarded by srv->mu; NULL once the request is over */
  int streaming;         /* (GIL) begin() was called */
  int keep_alive;
  int lost;          /* (IO thread, under mu) its client left before its answer was complete */
  PyObject* on_gone; /* (GIL) called once if it is lost: the work for it is cancelled */
};

extern PyTypeObject HttpServerType, HttpCallType;

/* ---- http1_input.c --------------------------------------------------------- */

/* Room for the next read of c (compacted first, grown within max_buffered_bytes): 1, or 0 when the
 * request arriving on c was refused for the budget (503; its input freed). */
int h1_in_room(HConn* c);
/* Before a request's `total` bytes are taken out of c's input and held: 1 if they fit within the
 * budget (the input giving back what it grew to for them), else 0, refused as above. */
int h1_in_take(HConn* c, size_t total);
/* (once a request's bytes are taken) Give back what a large request grew c's input to. */
void h1_in_shrink(HConn* c);
/* c's input buffer freed (counted as such). */
void h1_in_free(HConn* c);

/* ---- http1_conn.c ---------------------------------------------------------- */

void h1_readable(HConn* c);
void h1_parse(HConn* c);
void h1_flush(HConn* c);
void h1_update_events(HConn* c);
/* On or off the read-again list. */
void h1_pending_set(HConn* c, int on);
void h1_req_free(HttpServerObject* srv, HReq* r);
void h1_refuse(HConn* c, int status, const char* message);
void h1_schedule(HConn* c);
void h1_lost_locked(HttpServerObject* srv, HReq* r);

/* ---- http1_accept.c -------------------------------------------------------- */

void h1_close(HConn* c);
void h1_accept(HttpServerObject* srv);
void h1_sweep(HttpServerObject* srv);
int h1_idle(HConn* c);

/* ---- http1_loop.c, http1_server.c ------------------------------------------ */

void h1_wake(HttpServerObject* srv);
int h1_mark_dirty_locked(HttpServerObject* srv, HConn* c);
void* h1_main(void* arg);

#endif
