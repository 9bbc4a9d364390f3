/* embedtriton._h2: a small gRPC-over-HTTP/2 server transport on libnghttp2.
 *
 * One IO thread runs epoll over the listening socket, an eventfd and the
 * connections. Each loop iteration:
 *   1. epoll_wait with the GIL released (not waiting while events or
 *      left-over input are pending, and waking for the timers);
 *   2. read sockets, a bounded amount per connection (READ_BUDGET), and feed
 *      nghttp2 (no GIL); nghttp2 callbacks only record events (message,
 *      half-close, close) in srv->ev;
 *   3. take the GIL once and hand the recorded events to the Python handler,
 *      except those of streams already reset or of connections already gone;
 *   4. apply what send()/finish() queued (from any thread) to the sessions;
 *   5. timers (handshake and idle timeouts, accept pauses), every sweep_every;
 *   6. write what nghttp2 has to send, close finished connections.
 *
 * Limits against hostile clients: max_connections (at the cap, or when
 * accept() runs out of descriptors, an idle connection (no open stream) is
 * closed to admit the newcomer: evict_idle), handshake_timeout,
 * idle_timeout, max_header_list_bytes (and MAX_HEADER_FIELDS),
 * max_buffered_bytes (queued response bytes per connection, half of it per
 * stream; incomplete request messages per connection), max_incoming_bytes
 * (incomplete request messages across connections: GrpcOptions.max_buffered_bytes),
 * the rapid-reset and CONTINUATION limits of nghttp2 (RESET_BURST,
 * RESET_RATE, MAX_CONTINUATIONS), a reserve descriptor for EMFILE when no
 * connection can make room, and max_message_bytes on compressed request
 * messages once inflated too.
 *
 * Lifetimes: a Stream (C) exists from the request's HEADERS until its CLOSE
 * event has been dispatched; it owns one reference to its Call (Python),
 * created at the first event. Call.st points back at the Stream and is cleared
 * (under srv->mu) before the Stream is freed, so a late send() from another
 * thread finds NULL and does nothing. Only the IO thread frees Streams.
 * Stream.conn is also cleared under srv->mu (when the stream closes), and the
 * Conn is freed only after all its streams were, so send() may read the
 * connection's queued-bytes count under srv->mu.
 *
 * This header is private to the files beside it: the types they share, their
 * shared globals and the functions one file calls in another (everything else
 * in them is static). Each file includes it first: Python.h must come before
 * the system headers.
 *
 *   libs.c     dlopen()ing libnghttp2 and OpenSSL; library()
 *   session.c  streams, and the nghttp2 callbacks that feed them
 *   conn.c     connections: IO, accepting, timers
 *   loop.c     the IO thread: its loop, dispatch to Python, stopping
 *   call.c     the Call type, and the C interface that answers one without the GIL
 *   compress.c zlib: request messages inflated (bounded), responses deflated
 *   server.c   the Server type, TLS setup, the listener, the registry
 *   module.c   the module
 */
#ifndef EMBEDTRITON_H2_H
#define EMBEDTRITON_H2_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "h2_reply.h"
#include "nghttp2_api.h"

/* ---- libs.c: the dlopen()ed libraries ------------------------------------ */

#define ET_DECL_NG(ret, name, args) ret(*name) args;
typedef struct {
  ET_NGHTTP2_FUNCS(ET_DECL_NG)
} NgFuncs;
extern NgFuncs ng;
/* optional (see libs.c): NULL options when the library has neither limit */
extern int (*ng_session_server_new2)(nghttp2_session**, const nghttp2_session_callbacks*, void*,
                                     const nghttp2_option*);
extern nghttp2_option* ng_options;

#define ET_DECL_SSL(ret, name, args) ret(*name) args;
typedef struct {
  ET_SSL_FUNCS(ET_DECL_SSL)
} SslFuncs;
extern SslFuncs ossl;

int load_nghttp2(const char* libpath);
int load_openssl(const char* libpath);
PyObject* library_info(PyObject* mod, PyObject* args, PyObject* kw);

/* ------------------------------------------------------------------------ */
/* data structures                                                           */

typedef struct OutBuf {
  struct OutBuf* next;
  size_t len, off;
  uint8_t data[];
} OutBuf;

typedef struct ServerObject ServerObject;
typedef struct CallObject CallObject;
typedef struct Conn Conn;
typedef struct Stream Stream;

#define PEER_LEN 80

struct Stream {
  Conn*
      conn; /* NULL once nghttp2 closed the stream or the connection died (written under srv->mu) */
  int32_t id;
  Stream *cprev, *cnext; /* the connection's streams */
  CallObject* call;      /* strong reference; created with the GIL at the first event */
  char peer[PEER_LEN];

  /* request headers (IO thread) */
  char* path;
  char** meta; /* name, value, name, value, ... (NUL-terminated copies) */
  size_t nmeta, capmeta;
  size_t hdr_bytes,
      hdr_count; /* the request's header list: RFC 7540 size (name + value + 32 each), fields */
  int is_post, ctype_ok, headers_done, rejected;
  int hdr_over; /* 1: the list is over max_header_list_bytes, 2: it has too many fields */

  /* incoming message framing (IO thread) */
  uint8_t pfx[5];
  int pfx_have, in_msg, skipping, remote_closed;
  int req_enc;  /* the request's grpc-encoding (ENC_*) */
  int msg_comp; /* the message being received has the compressed flag */
  uint8_t* msg;
  size_t msg_len, msg_have, msg_cap; /* declared, received, allocated (grows with what arrives) */

  /* outgoing (IO thread) */
  OutBuf *oq_head, *oq_tail;
  int headers_sent, trailers_sent, fin_ready, closed;
  int do_reset, reset_sent; /* overflow seen by the IO thread; the stream was reset for it: nothing
                               more is sent */

  /* shared with threads calling send/finish: guarded by srv->mu */
  OutBuf *pq_head, *pq_tail;
  int finish_req, finished_by_app, fin_code;
  char* fin_msg; /* percent-encoded, written once when finish_req is set */
  size_t queued; /* bytes in pq and oq, not yet handed to nghttp2 */
  int overflow;  /* send() found the stream or its connection over its buffer limit */
  int resp_enc;  /* the responses' grpc-encoding (ENC_*), set by send() */
  int dirty;
  Stream *dprev, *dnext;
};

struct Conn {
  ServerObject* srv;
  int fd;
  SSL* ssl;
  int handshaking, dead, epollout;
  int preface_done; /* the client's SETTINGS (the end of its connection preface) arrived */
  int goaway_sent;  /* closing: an idle timeout sent GOAWAY */
  int evicted; /* closed to admit a new connection: flushed once (its GOAWAY), then closed, this
                  iteration */
  double accepted_at, close_at;
  double last_active; /* when it last received bytes or its last stream ended (the idle timeout
                         counts from it) */
  int pending_in;  /* read budget used up: on srv->pend, served again next iteration whatever epoll
                      says */
  unsigned served; /* the loop iteration that last read it */
  Conn *pprev, *pnext; /* srv->pend */
  nghttp2_session* sess;
  uint8_t* out;
  size_t outlen, outoff, outcap;
  size_t queued;  /* the sum of its streams' queued (srv->mu) */
  size_t partial; /* bytes allocated for its streams' incomplete request messages (IO thread; their
                     sum over connections is srv->g_partial) */
  Stream* streams;
  int nstreams;
  char peer[PEER_LEN];
  Conn *prev, *next;
};

enum { EV_MSG, EV_HALF_CLOSE, EV_CLOSE };
typedef struct {
  int type;
  Stream* st;
  uint8_t* data;
  size_t len;
} Event;

struct ServerObject {
  PyObject_HEAD
  PyObject *on_message, *on_half_close, *on_cancel;
  size_t max_msg;
  int port;
  int listen_fd, epfd, evfd;
  pthread_t thread;
  int started, joined, thread_ref;
  pthread_mutex_t join_mu;
  PyThreadState* tstate; /* IO thread's */
  nghttp2_session_callbacks* cbs;
  SSL_CTX* ssl_ctx;

  /* Held by the IO thread but while it waits in epoll_wait, when a thread that answered a call may
   * take it (write_or_wake) and write the answer itself; io_waiting: it is so waiting. */
  pthread_mutex_t io_mu;
  int io_waiting;

  /* guarded by mu */
  pthread_mutex_t mu;
  Stream* dirty_head;
  int wake_pending, in_dispatch, stop_req;
  double grace;

  /* limits (set before the IO thread starts) */
  int max_conns;
  size_t max_hdr, max_buf, max_buf_stream;
  size_t max_incoming; /* bytes of incomplete request messages across connections */
  double idle_timeout, handshake_timeout, sweep_every;

  /* IO thread only */
  Conn* conns;
  int nconns;
  Conn* pend; /* connections with input left over (conn_readable) */
  unsigned iter;
  int reserve_fd;   /* spent to accept-and-close a connection when descriptors run out */
  double accept_at; /* > 0: accepting is paused until then */
  double now, next_sweep;
  Event* ev;
  size_t nev, capev;
  Stream** work;
  size_t capwork;
  int stopping, hard;
  double deadline;
  uint8_t* rbuf;
  ServerObject* reg_next; /* registry of running servers (GIL) */

  /* counters written by the IO thread, read by stats() (relaxed atomics) */
  uint64_t n_accepted, n_refused, n_emfile, n_idle_closed, n_handshake_timeouts, n_buffer_resets,
      n_evicted, n_written_now;
  uint64_t n_budget; /* calls failed for max_incoming */
  int64_t n_open;
  int64_t g_partial; /* gauge (written by the IO thread only): the connections' partial, summed */
};

#define STAT_ADD(field, v) __atomic_add_fetch(&(field), (v), __ATOMIC_RELAXED)
#define STAT_GET(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)

struct CallObject {
  PyObject_HEAD
  ServerObject* srv; /* strong */
  Stream* st;        /* guarded by srv->mu; NULL once the stream is gone */
  PyObject *method, *user, *metadata;
  int comp, sent; /* (GIL) the responses' compression (ENC_*), fixed by the first send() */
  char** meta;
  size_t nmeta;
  char peer[PEER_LEN];
};

extern PyTypeObject ServerType, CallType;
extern const H2Reply h2_reply;    /* (call.c) the C interface of h2_reply.h, module._REPLY */
extern PyTypeObject HttpCallType; /* (http1_call.c) */
int h1_reply(PyObject* call, int status, const char* fields, const void* body, size_t len);
int h1_on_gone(PyObject* call, PyObject* fn);

#define RBUF_SIZE (256 * 1024)
/* What one connection may read per loop iteration, TLS or not, so that one fast sender cannot hold
 * the IO thread while the others wait: up to READ_BUDGET bytes in at most READ_CALLS reads. A
 * plaintext connection gets one recv() of RBUF_SIZE; a TLS one up to 16 SSL_read()s, each returning
 * one record (at most 16 KiB), since a client sending one-byte records would otherwise cost two
 * syscalls and a decryption per byte within one budget. */
#define READ_BUDGET RBUF_SIZE
#define READ_CALLS 16
#define FLUSH_AT (256 * 1024)

static inline void* xrealloc(void* p, size_t n)
{
  void* q = realloc(p, n);
  if (!q) abort(); /* out of memory in the IO thread: nothing sensible left to do */
  return q;
}

static inline double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define MAKE_NV(n, v, vl) {(uint8_t*)(n), (uint8_t*)(v), sizeof(n) - 1, (vl), NGHTTP2_NV_FLAG_NONE}

/* ---- compress.c: gRPC message compression (zlib) -------------------------- */

enum { ENC_IDENTITY, ENC_DEFLATE, ENC_GZIP, ENC_UNKNOWN };
#define ACCEPT_ENCODING \
  "identity, deflate, gzip" /* what a grpc-accept-encoding header of ours says */
int encoding_of(const char* v, size_t n);
const char* encoding_name(int enc);
/* Inflate a compressed request message into a new buffer of at most max bytes: 0 and *out, *outlen;
 * or a gRPC status (RESOURCE_EXHAUSTED: larger than max; INTERNAL: corrupt) with its message in
 * err. */
int inflate_message(int enc, const uint8_t* in, size_t n, size_t max, uint8_t** out, size_t* outlen,
                    char* err, size_t errsize);
/* A response message deflated, with its gRPC prefix (flag 1); NULL when compressing does not make
 * it smaller. */
OutBuf* deflate_message(int enc, const uint8_t* in, size_t n);

/* ---- session.c: streams and the nghttp2 callbacks ------------------------ */

char* percent_encode(const char* s, size_t n);
void wake(ServerObject* srv);
int mark_dirty_locked(ServerObject* srv, Stream* st);
void unlink_dirty_locked(ServerObject* srv, Stream* st);
int finish_locked(ServerObject* srv, Stream* st, int code, char* enc_msg, int by_app,
                  int* need_wake);
void free_outbufs(OutBuf* b);
void free_meta(char** meta, size_t nmeta);
void stream_free(Stream* st);
void stream_detach(Stream* st);
ssize_t data_read_cb(nghttp2_session* sess, int32_t id, uint8_t* buf, size_t length,
                     uint32_t* flags, nghttp2_data_source* src, void* ud);
nghttp2_session_callbacks* make_callbacks(void);

/* ---- conn.c: connections ------------------------------------------------- */

struct sockaddr_storage;
/* A new connection on an accepted socket (also how tests/fuzz/h2_session.c opens one). */
void h2_conn_new(ServerObject* srv, int fd, const struct sockaddr_storage* sa);
void conn_readable(Conn* c);
void conn_flush(Conn* c);
void conn_close(Conn* c);
void accept_some(ServerObject* srv);
void sweep(ServerObject* srv);

/* ---- loop.c, server.c: the IO thread and the registry -------------------- */

void* io_main(void* arg);
/* Apply what send()/finish() queued to the sessions: the number of streams (in srv->work). */
size_t h2_apply_dirty(ServerObject* srv);
void write_or_wake(ServerObject* srv);
PyObject* stop_all_servers(PyObject* mod, PyObject* unused);
SSL_CTX* tls_context(PyObject* tls, const char* libpath, int h2);
int listen_on(const char* host, int port, int* fd_out, int* bound);

/* ---- http1_*.c: the HTTP/1.1 server (http1.h) ---------------------------- */

int http1_add_types(PyObject* mod); /* HttpServer, HttpCall and their atexit stop */

#endif
