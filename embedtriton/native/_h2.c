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
 * Limits against hostile clients: max_connections, handshake_timeout,
 * idle_timeout, max_header_list_bytes (and MAX_HEADER_FIELDS),
 * max_buffered_bytes (queued response bytes per connection, half of it per
 * stream), the rapid-reset and CONTINUATION limits of nghttp2 (RESET_BURST,
 * RESET_RATE, MAX_CONTINUATIONS), and a reserve descriptor for EMFILE.
 *
 * Lifetimes: a Stream (C) exists from the request's HEADERS until its CLOSE
 * event has been dispatched; it owns one reference to its Call (Python),
 * created at the first event. Call.st points back at the Stream and is cleared
 * (under srv->mu) before the Stream is freed, so a late send() from another
 * thread finds NULL and does nothing. Only the IO thread frees Streams.
 * Stream.conn is also cleared under srv->mu (when the stream closes), and the
 * Conn is freed only after all its streams were, so send() may read the
 * connection's queued-bytes count under srv->mu.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <libgen.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "nghttp2_api.h"

/* ------------------------------------------------------------------------ */
/* dynamically loaded libraries                                              */

#define ET_DECL_NG(ret, name, args) ret(*name) args;
typedef struct {
  ET_NGHTTP2_FUNCS(ET_DECL_NG)
} NgFuncs;
static NgFuncs ng;
static int ng_loaded;
/* optional: the rapid-reset (CVE-2023-44487) limit and the CONTINUATION-flood (CVE-2024-30255) limit, in nghttp2
 * >= 1.57 / 1.61 and in distribution backports (Debian 12's 1.52.0, the Triton wheel's 1.43.0) */
static int (*ng_option_new)(nghttp2_option **);
static void (*ng_option_del)(nghttp2_option *);
static void (*ng_option_set_stream_reset_rate_limit)(nghttp2_option *, uint64_t burst, uint64_t rate);
static void (*ng_option_set_max_continuations)(nghttp2_option *, size_t);
static int (*ng_session_server_new2)(nghttp2_session **, const nghttp2_session_callbacks *, void *,
                                     const nghttp2_option *);
static nghttp2_option *ng_options;

/* What library() reports about the libnghttp2 in use. */
static struct {
  char path[4096];
  char version[32];
  int version_num, reset_rate_limit, max_continuations;
} ng_info;

/* Rapid reset (CVE-2023-44487): a token bucket per connection, one token per RST_STREAM the client sends; when it is
 * empty nghttp2 sends GOAWAY and the connection ends. nghttp2's default is a burst of 1000 refilled at 33/s.
 *
 * Measured here (2 vCPUs, a trivial handler, IO thread CPU time per reset stream): ~1.7 us for a request reset in
 * the same read, which never reaches Python (dispatch drops it), ~3-4 us for one reset after on_message and
 * on_half_close ran (on_cancel follows). What a reset costs beyond that is the application's work for a call that
 * is then cancelled: ~160 us of CPU for an AddSub inference through Triton (12,683 infer/s on 2 cores, README).
 * The burst bounds that work per connection, the rate its sustained share:
 *  - burst 1000, nghttp2's own: at most ~0.16 s of such work, once per connection (max_connections bounds how
 *    many); the old 10,000 let one connection queue seconds of it ahead of every other client;
 *  - rate 500/s instead of 33/s: a busy client cancelling a few hundred calls a second (deadlines, hedged requests)
 *    keeps its connection, where 33/s dropped one cancelling 66/s after ~30 s; a flooding connection is held to
 *    ~8 % of one core of cancelled inference work (500 x 160 us) and ~0.2 % of the IO thread for the transport's
 *    part (tests/adversarial checks both: a flood gets GOAWAY within the budget, 400 cancels/s do not).
 */
#define RESET_BURST 1000
#define RESET_RATE 500
/* nghttp2's own default (8 CONTINUATION frames per header block), set explicitly so that it holds whatever the
 * library's default is. */
#define MAX_CONTINUATIONS 8

static int load_symbols(void *h, const char *prefix, const char *const *names, void **slots, size_t n, char *err,
                        size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    char full[128];
    snprintf(full, sizeof full, "%s%s", prefix, names[i]);
    slots[i] = dlsym(h, full);
    if (!slots[i]) {
      snprintf(err, errlen, "symbol %s not found", full);
      return -1;
    }
  }
  return 0;
}

#define ET_NAME(ret, name, args) #name,
static const char *const ng_names[] = {ET_NGHTTP2_FUNCS(ET_NAME)};
static const char *const ssl_names[] = {ET_SSL_FUNCS(ET_NAME)};

/* One libnghttp2 that could be used: its handle, what it offers, and where it was found. */
typedef struct {
  void *h;
  NgFuncs f;
  int version_num, reset_rate_limit, max_continuations;
  char version[32], path[4096];
} NgCandidate;

static int ng_probe(const char *name, NgCandidate *c, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  c->h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!c->h) {
    snprintf(err, errlen, "dlopen(%s) failed: %s", name, dlerror());
    return -1;
  }
  char why[256];
  if (load_symbols(c->h, "nghttp2_", ng_names, (void **)&c->f, sizeof ng_names / sizeof *ng_names, why,
                   sizeof why) < 0) {
    snprintf(err, errlen, "%s is too old or not nghttp2: %s", name, why);
    dlclose(c->h);
    c->h = NULL;
    return -1;
  }
  nghttp2_info *info = c->f.version(0);
  c->version_num = info ? info->version_num : 0;
  snprintf(c->version, sizeof c->version, "%s", info && info->version_str ? info->version_str : "?");
  int opts = dlsym(c->h, "nghttp2_option_new") && dlsym(c->h, "nghttp2_option_del") &&
             dlsym(c->h, "nghttp2_session_server_new2");
  c->reset_rate_limit = opts && dlsym(c->h, "nghttp2_option_set_stream_reset_rate_limit");
  c->max_continuations = opts && dlsym(c->h, "nghttp2_option_set_max_continuations");
  Dl_info dl;
  char real[4096];
  if (dladdr((void *)c->f.version, &dl) && dl.dli_fname && realpath(dl.dli_fname, real))
    snprintf(c->path, sizeof c->path, "%s", real);
  else
    snprintf(c->path, sizeof c->path, "%s", name);
  return 0;
}

/* Which of two usable libraries to keep: the one with more of the two security options, then the newer. */
static int ng_better(const NgCandidate *a, const NgCandidate *b) {
  int sa = a->reset_rate_limit + a->max_continuations, sb = b->reset_rate_limit + b->max_continuations;
  if (sa != sb) return sa > sb;
  return a->version_num > b->version_num;
}

static void ng_use(NgCandidate *c) {
  ng = c->f;
  ng_option_new = (int (*)(nghttp2_option **))dlsym(c->h, "nghttp2_option_new");
  ng_option_del = (void (*)(nghttp2_option *))dlsym(c->h, "nghttp2_option_del");
  ng_session_server_new2 = (int (*)(nghttp2_session **, const nghttp2_session_callbacks *, void *,
                                    const nghttp2_option *))dlsym(c->h, "nghttp2_session_server_new2");
  ng_option_set_stream_reset_rate_limit =
      (void (*)(nghttp2_option *, uint64_t, uint64_t))dlsym(c->h, "nghttp2_option_set_stream_reset_rate_limit");
  ng_option_set_max_continuations =
      (void (*)(nghttp2_option *, size_t))dlsym(c->h, "nghttp2_option_set_max_continuations");
  if ((c->reset_rate_limit || c->max_continuations) && ng_option_new(&ng_options) == 0) {
    if (c->reset_rate_limit) ng_option_set_stream_reset_rate_limit(ng_options, RESET_BURST, RESET_RATE);
    if (c->max_continuations) ng_option_set_max_continuations(ng_options, MAX_CONTINUATIONS);
  } else {
    ng_options = NULL;
  }
  snprintf(ng_info.path, sizeof ng_info.path, "%s", c->path);
  snprintf(ng_info.version, sizeof ng_info.version, "%s", c->version);
  ng_info.version_num = c->version_num;
  ng_info.reset_rate_limit = c->reset_rate_limit;
  ng_info.max_continuations = c->max_continuations;
  ng_loaded = 1;
}

/* EMBEDTRITON_NGHTTP2=/path/libnghttp2.so forces that library. Otherwise both the system's libnghttp2.so.14 and the
 * caller's libpath (the copy bundled with the Triton wheel) are tried, and the better one (ng_better) is kept. */
static int load_nghttp2(const char *libpath) {
  if (ng_loaded) return 0;
  char err[1024] = "", err2[1024] = "";
  NgCandidate a, b;
  const char *forced = getenv("EMBEDTRITON_NGHTTP2");
  if (forced && forced[0]) {
    if (ng_probe(forced, &a, err, sizeof err) < 0) {
      PyErr_Format(PyExc_ImportError, "EMBEDTRITON_NGHTTP2=%s is unusable: %s", forced, err);
      return -1;
    }
    ng_use(&a);
    return 0;
  }
  int ok_a = ng_probe("libnghttp2.so.14", &a, err, sizeof err) == 0;
  int ok_b = libpath && ng_probe(libpath, &b, err2, sizeof err2) == 0;
  if (!ok_a && !ok_b) {
    PyErr_Format(PyExc_ImportError,
                 "embedtriton._h2 needs libnghttp2: %s%s%s; install libnghttp2-14 or the nvidia-pytriton wheel, which "
                 "bundles it (or set EMBEDTRITON_NGHTTP2 to a libnghttp2.so)",
                 err, libpath ? "; " : ", and no fallback path was given", libpath ? err2 : "");
    return -1;
  }
  NgCandidate *keep = ok_a && (!ok_b || !ng_better(&b, &a)) ? &a : &b, *drop = keep == &a ? &b : &a;
  int drop_ok = keep == &a ? ok_b : ok_a;
  ng_use(keep);
  if (drop_ok) dlclose(drop->h); /* the same file opened twice is one handle with two references */
  return 0;
}

#define ET_DECL_SSL(ret, name, args) ret(*name) args;
static struct {
  ET_SSL_FUNCS(ET_DECL_SSL)
} ossl;
static int ossl_loaded;

static int load_openssl(const char *libpath) {
  if (ossl_loaded) return 0;
  void *h = dlopen("libssl.so.3", RTLD_NOW | RTLD_LOCAL);
  char err[512] = "";
  if (!h) snprintf(err, sizeof err, "%s", dlerror());
  if (!h && libpath) { /* the nvidia-pytriton wheel bundles libssl-<hash>.so.3 beside libnghttp2 */
    char dir[4096], pattern[4200];
    snprintf(dir, sizeof dir, "%s", libpath);
    snprintf(pattern, sizeof pattern, "%s/libssl*.so.3", dirname(dir));
    glob_t g;
    if (glob(pattern, 0, NULL, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc && !h; i++) h = dlopen(g.gl_pathv[i], RTLD_NOW | RTLD_LOCAL);
      globfree(&g);
    }
  }
  if (!h) {
    PyErr_Format(PyExc_ImportError, "TLS needs OpenSSL 3: dlopen(libssl.so.3) failed (%s)", err);
    return -1;
  }
  if (load_symbols(h, "", ssl_names, (void **)&ossl, sizeof ssl_names / sizeof *ssl_names, err, sizeof err) < 0) {
    PyErr_Format(PyExc_ImportError, "libssl.so.3 is unusable: %s", err);
    dlclose(h);
    return -1;
  }
  ossl_loaded = 1;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* data structures                                                           */

typedef struct OutBuf {
  struct OutBuf *next;
  size_t len, off;
  uint8_t data[];
} OutBuf;

typedef struct ServerObject ServerObject;
typedef struct CallObject CallObject;
typedef struct Conn Conn;
typedef struct Stream Stream;

#define PEER_LEN 80

struct Stream {
  Conn *conn; /* NULL once nghttp2 closed the stream or the connection died (written under srv->mu) */
  int32_t id;
  Stream *cprev, *cnext; /* the connection's streams */
  CallObject *call;      /* strong reference; created with the GIL at the first event */
  char peer[PEER_LEN];

  /* request headers (IO thread) */
  char *path;
  char **meta; /* name, value, name, value, ... (NUL-terminated copies) */
  size_t nmeta, capmeta;
  size_t hdr_bytes, hdr_count; /* the request's header list: RFC 7540 size (name + value + 32 each), fields */
  int is_post, ctype_ok, headers_done, rejected;
  int hdr_over; /* 1: the list is over max_header_list_bytes, 2: it has too many fields */

  /* incoming message framing (IO thread) */
  uint8_t pfx[5];
  int pfx_have, in_msg, skipping, remote_closed;
  uint8_t *msg;
  size_t msg_len, msg_have, msg_cap; /* declared, received, allocated (grows with what arrives) */

  /* outgoing (IO thread) */
  OutBuf *oq_head, *oq_tail;
  int headers_sent, trailers_sent, fin_ready, closed;
  int do_reset, reset_sent; /* overflow seen by the IO thread; the stream was reset for it: nothing more is sent */

  /* shared with threads calling send/finish: guarded by srv->mu */
  OutBuf *pq_head, *pq_tail;
  int finish_req, finished_by_app, fin_code;
  char *fin_msg; /* percent-encoded, written once when finish_req is set */
  size_t queued; /* bytes in pq and oq, not yet handed to nghttp2 */
  int overflow;  /* send() found the stream or its connection over its buffer limit */
  int dirty;
  Stream *dprev, *dnext;
};

struct Conn {
  ServerObject *srv;
  int fd;
  SSL *ssl;
  int handshaking, dead, epollout;
  int preface_done; /* the client's SETTINGS (the end of its connection preface) arrived */
  int goaway_sent;  /* closing: an idle timeout sent GOAWAY */
  double accepted_at, close_at;
  double last_active; /* when it last received bytes or its last stream ended (the idle timeout counts from it) */
  int pending_in;      /* read budget used up: on srv->pend, served again next iteration whatever epoll says */
  unsigned served;     /* the loop iteration that last read it */
  Conn *pprev, *pnext; /* srv->pend */
  nghttp2_session *sess;
  uint8_t *out;
  size_t outlen, outoff, outcap;
  size_t queued; /* the sum of its streams' queued (srv->mu) */
  size_t partial; /* bytes allocated for its streams' incomplete request messages (IO thread) */
  Stream *streams;
  int nstreams;
  char peer[PEER_LEN];
  Conn *prev, *next;
};

enum { EV_MSG, EV_HALF_CLOSE, EV_CLOSE };
typedef struct {
  int type;
  Stream *st;
  uint8_t *data;
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
  PyThreadState *tstate; /* IO thread's */
  nghttp2_session_callbacks *cbs;
  SSL_CTX *ssl_ctx;

  /* guarded by mu */
  pthread_mutex_t mu;
  Stream *dirty_head;
  int wake_pending, in_dispatch, stop_req;
  double grace;

  /* limits (set before the IO thread starts) */
  int max_conns;
  size_t max_hdr, max_buf, max_buf_stream;
  double idle_timeout, handshake_timeout, sweep_every;

  /* IO thread only */
  Conn *conns;
  int nconns;
  Conn *pend; /* connections with input left over (conn_readable) */
  unsigned iter;
  int reserve_fd;   /* spent to accept-and-close a connection when descriptors run out */
  double accept_at; /* > 0: accepting is paused until then */
  double now, next_sweep;
  Event *ev;
  size_t nev, capev;
  Stream **work;
  size_t capwork;
  int stopping, hard;
  double deadline;
  uint8_t *rbuf;
  ServerObject *reg_next; /* registry of running servers (GIL) */

  /* counters written by the IO thread, read by stats() (relaxed atomics) */
  uint64_t n_accepted, n_refused, n_emfile, n_idle_closed, n_handshake_timeouts, n_buffer_resets;
  int64_t n_open;
};

#define STAT_ADD(field, v) __atomic_add_fetch(&(field), (v), __ATOMIC_RELAXED)
#define STAT_GET(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)

struct CallObject {
  PyObject_HEAD
  ServerObject *srv; /* strong */
  Stream *st;        /* guarded by srv->mu; NULL once the stream is gone */
  PyObject *method, *user, *metadata;
  char **meta;
  size_t nmeta;
  char peer[PEER_LEN];
};

static PyTypeObject ServerType, CallType;
static ServerObject *registry; /* servers whose IO thread is running */

#define RBUF_SIZE (256 * 1024)
/* What one connection may read per loop iteration, TLS or not, so that one fast sender cannot hold the IO thread
 * while the others wait: up to READ_BUDGET bytes in at most READ_CALLS reads. A plaintext connection gets one
 * recv() of RBUF_SIZE; a TLS one up to 16 SSL_read()s, each returning one record (at most 16 KiB), since a client
 * sending one-byte records would otherwise cost two syscalls and a decryption per byte within one budget. */
#define READ_BUDGET RBUF_SIZE
#define READ_CALLS 16
#define FLUSH_AT (256 * 1024)

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n);
  if (!q) abort(); /* out of memory in the IO thread: nothing sensible left to do */
  return q;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* grpc-message is percent-encoded: bytes outside 0x20..0x7e and '%' become %XX */
static char *percent_encode(const char *s, size_t n) {
  char *out = malloc(n * 3 + 1), *o = out;
  if (!out) return NULL;
  static const char hex[] = "0123456789ABCDEF";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      *o++ = (char)c;
    } else {
      *o++ = '%';
      *o++ = hex[c >> 4];
      *o++ = hex[c & 15];
    }
  }
  *o = 0;
  return out;
}

static void wake(ServerObject *srv) {
  uint64_t one = 1;
  ssize_t r = write(srv->evfd, &one, sizeof one);
  (void)r;
}

/* Put st on the dirty list; return 1 if the caller must wake the IO thread. Holds mu. */
static int mark_dirty_locked(ServerObject *srv, Stream *st) {
  if (!st->dirty) {
    st->dirty = 1;
    st->dprev = NULL;
    st->dnext = srv->dirty_head;
    if (srv->dirty_head) srv->dirty_head->dprev = st;
    srv->dirty_head = st;
  }
  if (srv->in_dispatch || srv->wake_pending) return 0;
  srv->wake_pending = 1;
  return 1;
}

static void unlink_dirty_locked(ServerObject *srv, Stream *st) {
  if (!st->dirty) return;
  if (st->dprev) st->dprev->dnext = st->dnext;
  else srv->dirty_head = st->dnext;
  if (st->dnext) st->dnext->dprev = st->dprev;
  st->dirty = 0;
  st->dprev = st->dnext = NULL;
}

/* Request the end of a call with a status (takes ownership of enc_msg). Holds mu.
 * Returns 1 if it took effect, 0 if the call was already finishing. */
static int finish_locked(ServerObject *srv, Stream *st, int code, char *enc_msg, int by_app, int *need_wake) {
  if (st->finish_req) {
    free(enc_msg);
    return 0;
  }
  st->finish_req = 1;
  st->finished_by_app = by_app;
  st->fin_code = code;
  st->fin_msg = enc_msg;
  *need_wake = mark_dirty_locked(srv, st);
  return 1;
}

/* A status decided by the transport itself (IO thread, no GIL). */
static void finish_internal(Stream *st, int code, const char *msg) {
  ServerObject *srv = st->conn ? st->conn->srv : NULL;
  if (!srv) return;
  char *enc = percent_encode(msg, strlen(msg));
  int need_wake = 0;
  pthread_mutex_lock(&srv->mu);
  finish_locked(srv, st, code, enc, 0, &need_wake);
  pthread_mutex_unlock(&srv->mu);
  /* no wake needed: the IO thread applies dirty streams later in this iteration */
}

static void free_outbufs(OutBuf *b) {
  while (b) {
    OutBuf *n = b->next;
    free(b);
    b = n;
  }
}

static void free_meta(char **meta, size_t nmeta) {
  if (!meta) return;
  for (size_t i = 0; i < 2 * nmeta; i++) free(meta[i]);
  free(meta);
}

static void stream_free(Stream *st) {
  free(st->path);
  free_meta(st->meta, st->nmeta);
  free(st->msg);
  free_outbufs(st->oq_head);
  free_outbufs(st->pq_head);
  free(st->fin_msg);
  free(st);
}

static void push_event(ServerObject *srv, int type, Stream *st, uint8_t *data, size_t len) {
  if (srv->nev == srv->capev) {
    srv->capev = srv->capev ? srv->capev * 2 : 64;
    srv->ev = xrealloc(srv->ev, srv->capev * sizeof *srv->ev);
  }
  srv->ev[srv->nev++] = (Event){type, st, data, len};
}

/* The stream is over for nghttp2 (closed) or its connection died. */
static void stream_detach(Stream *st) {
  Conn *c = st->conn;
  if (!c) return;
  if (st->cprev) st->cprev->cnext = st->cnext;
  else c->streams = st->cnext;
  if (st->cnext) st->cnext->cprev = st->cprev;
  c->nstreams--;
  c->partial -= st->msg_cap; /* an incomplete request message goes with its stream */
  st->msg_cap = 0;
  c->last_active = c->srv->now; /* a call that outlasted idle_timeout does not make its connection idle at once */
  pthread_mutex_lock(&c->srv->mu); /* send() reads st->conn and the counts under mu */
  st->conn = NULL;
  c->queued -= st->queued;
  st->queued = 0;
  pthread_mutex_unlock(&c->srv->mu);
  st->closed = 1;
  push_event(c->srv, EV_CLOSE, st, NULL, 0);
}

/* ------------------------------------------------------------------------ */
/* nghttp2 callbacks (IO thread, no GIL)                                     */

#define MAKE_NV(n, v, vl) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vl), NGHTTP2_NV_FLAG_NONE}

static ssize_t data_read_cb(nghttp2_session *sess, int32_t id, uint8_t *buf, size_t length, uint32_t *flags,
                            nghttp2_data_source *src, void *ud) {
  Stream *st = src->ptr;
  if (st->reset_sent) return NGHTTP2_ERR_DEFERRED;
  size_t n = 0;
  while (n < length && st->oq_head) {
    OutBuf *b = st->oq_head;
    size_t take = b->len - b->off;
    if (take > length - n) take = length - n;
    memcpy(buf + n, b->data + b->off, take);
    n += take;
    b->off += take;
    if (b->off == b->len) {
      st->oq_head = b->next;
      if (!st->oq_head) st->oq_tail = NULL;
      free(b);
    }
  }
  if (n) {
    ServerObject *srv = ((Conn *)ud)->srv;
    pthread_mutex_lock(&srv->mu);
    st->queued -= n;
    ((Conn *)ud)->queued -= n;
    pthread_mutex_unlock(&srv->mu);
  }
  if (!st->oq_head) {
    if (st->fin_ready && !st->trailers_sent) {
      char code[16];
      int cl = snprintf(code, sizeof code, "%d", st->fin_code);
      const char *m = st->fin_msg ? st->fin_msg : "";
      nghttp2_nv tr[2] = {MAKE_NV("grpc-status", code, (size_t)cl), MAKE_NV("grpc-message", m, strlen(m))};
      *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
      if (ng.submit_trailer(sess, id, tr, m[0] ? 2 : 1) != 0) *flags &= ~(uint32_t)NGHTTP2_DATA_FLAG_NO_END_STREAM;
      st->trailers_sent = 1;
      return (ssize_t)n;
    }
    if (n == 0) return NGHTTP2_ERR_DEFERRED;
  }
  return (ssize_t)n;
}

/* Send DATA frames as large as flow control and the peer's frame size allow (up to 1 MiB). */
static ssize_t read_length_cb(nghttp2_session *sess, uint8_t type, int32_t id, int32_t swin, int32_t stwin,
                              uint32_t maxframe, void *ud) {
  (void)sess, (void)type, (void)id, (void)ud;
  ssize_t n = maxframe;
  if (swin < n) n = swin;
  if (stwin < n) n = stwin;
  if (n > (1 << 20)) n = 1 << 20;
  return n < 1 ? 1 : n;
}

static int on_begin_headers(nghttp2_session *sess, const nghttp2_frame *f, void *ud) {
  Conn *c = ud;
  if (f->hd.type != NGHTTP2_HEADERS || ng.session_get_stream_user_data(sess, f->hd.stream_id)) return 0;
  Stream *st = calloc(1, sizeof *st);
  if (!st) return NGHTTP2_ERR_CALLBACK_FAILURE;
  st->conn = c;
  st->id = f->hd.stream_id;
  memcpy(st->peer, c->peer, PEER_LEN);
  st->cnext = c->streams;
  if (c->streams) c->streams->cprev = st;
  c->streams = st;
  c->nstreams++;
  ng.session_set_stream_user_data(sess, st->id, st);
  return 0;
}

static char *dup_n(const uint8_t *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) abort();
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

/* At most this many header fields per request (pseudo-headers included), whatever their size: Envoy's and nghttpx's
 * default is 100 as well, and a gRPC client sends about ten. */
#define MAX_HEADER_FIELDS 100

static int on_header(nghttp2_session *sess, const nghttp2_frame *f, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *ud) {
  (void)flags;
  Stream *st = ng.session_get_stream_user_data(sess, f->hd.stream_id);
  if (!st || st->headers_done) return 0; /* trailers from the client: ignored */
  /* HPACK makes a header cheap to send and dear to keep: one byte can refer to a 4 KiB table entry. The list is
   * measured before anything is copied; once over the limit, what was kept is freed and the rest only counted. The
   * request is refused when its header block ends (on_frame_recv). */
  st->hdr_bytes += namelen + valuelen + 32;
  st->hdr_count++;
  if (st->hdr_over) return 0;
  if (st->hdr_bytes > ((Conn *)ud)->srv->max_hdr || st->hdr_count > MAX_HEADER_FIELDS) {
    st->hdr_over = st->hdr_bytes > ((Conn *)ud)->srv->max_hdr ? 1 : 2; /* which limit it met first */
    free_meta(st->meta, st->nmeta);
    st->meta = NULL;
    st->nmeta = st->capmeta = 0;
    return 0;
  }
  if (namelen && name[0] == ':') {
    if (namelen == 5 && !memcmp(name, ":path", 5)) {
      free(st->path);
      st->path = dup_n(value, valuelen);
    } else if (namelen == 7 && !memcmp(name, ":method", 7)) {
      st->is_post = valuelen == 4 && !memcmp(value, "POST", 4);
    }
    return 0;
  }
  if (namelen == 12 && !memcmp(name, "content-type", 12))
    st->ctype_ok = valuelen >= 16 && !memcmp(value, "application/grpc", 16) &&
                   (valuelen == 16 || value[16] == '+' || value[16] == ';');
  if (st->nmeta == st->capmeta) {
    st->capmeta = st->capmeta ? st->capmeta * 2 : 8;
    st->meta = xrealloc(st->meta, 2 * st->capmeta * sizeof(char *));
  }
  st->meta[2 * st->nmeta] = dup_n(name, namelen);
  st->meta[2 * st->nmeta + 1] = dup_n(value, valuelen);
  st->nmeta++;
  return 0;
}

static void reject(nghttp2_session *sess, Stream *st, const char *status, int code, const char *msg) {
  char *enc = percent_encode(msg, strlen(msg));
  char cs[16];
  int cl = snprintf(cs, sizeof cs, "%d", code);
  nghttp2_nv h[4] = {MAKE_NV(":status", status, strlen(status)), MAKE_NV("content-type", "application/grpc", 16),
                     MAKE_NV("grpc-status", cs, (size_t)cl), MAKE_NV("grpc-message", enc, strlen(enc))};
  ng.submit_response(sess, st->id, h, 4, NULL);
  free(enc);
  st->rejected = 1;
  st->headers_sent = st->trailers_sent = 1;
  st->finish_req = st->finished_by_app = 1; /* nobody else can see this stream yet */
}

static void on_remote_end(Stream *st) {
  st->remote_closed = 1;
  if (st->rejected || st->skipping) return;
  if (st->pfx_have || st->in_msg) {
    st->skipping = 1;
    finish_internal(st, 13, "the request ended inside a message");
    return;
  }
  push_event(st->conn->srv, EV_HALF_CLOSE, st, NULL, 0);
}

static int on_frame_recv(nghttp2_session *sess, const nghttp2_frame *f, void *ud) {
  if (f->hd.type == NGHTTP2_SETTINGS) { /* nghttp2 checked the magic; this ends the client's connection preface */
    ((Conn *)ud)->preface_done = 1;
    return 0;
  }
  if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) return 0;
  Stream *st = ng.session_get_stream_user_data(sess, f->hd.stream_id);
  if (!st) return 0;
  if (f->hd.type == NGHTTP2_HEADERS && !st->headers_done) {
    st->headers_done = 1;
    if (st->hdr_over) { /* as grpc-core says it: RESOURCE_EXHAUSTED, naming the limit */
      char m[160];
      size_t limit = ((Conn *)ud)->srv->max_hdr;
      if (st->hdr_over == 2)
        snprintf(m, sizeof m, "received metadata has too many entries (%zu vs. %d)", st->hdr_count,
                 MAX_HEADER_FIELDS);
      else
        snprintf(m, sizeof m, "received metadata size exceeds limit (%zu vs. %zu bytes)", st->hdr_bytes, limit);
      reject(sess, st, "200", 8, m);
    } else if (!st->is_post) reject(sess, st, "405", 13, "gRPC requests must use POST");
    else if (!st->ctype_ok) reject(sess, st, "415", 13, "content-type must be application/grpc");
    else if (!st->path) reject(sess, st, "400", 13, "missing :path");
  }
  if (f->hd.flags & NGHTTP2_FLAG_END_STREAM) on_remote_end(st);
  return 0;
}

/* A request message's buffer starts at this size at most and doubles as its bytes arrive (up to its declared
 * length): a client that declares 64 MiB and sends 5 bytes gets 64 KiB, not 64 MiB. */
#define MSG_FIRST_ALLOC (64 * 1024)

/* Grow (or first allocate) st's message buffer to cap bytes, within the connection's bound on incomplete request
 * messages (max_buffered_bytes, and never less than one message of max_message_bytes): without it, a client could
 * open 1024 streams and leave a large message half-sent on each. Beyond the bound the call fails with
 * RESOURCE_EXHAUSTED and the rest of its message is skipped. Returns 0 when it failed. */
static int grow_message(Conn *c, Stream *st, size_t cap) {
  size_t bound = c->srv->max_buf > c->srv->max_msg ? c->srv->max_buf : c->srv->max_msg;
  size_t more = cap - st->msg_cap; /* msg_cap is 0 while st->msg is NULL */
  uint8_t *grown = NULL;
  if (c->partial + more <= bound) grown = realloc(st->msg, cap ? cap : 1);
  if (!grown) {
    char m[200];
    if (c->partial + more > bound)
      snprintf(m, sizeof m, "the connection holds more than %zu bytes of incomplete request messages", bound);
    else
      snprintf(m, sizeof m, "out of memory for the request message");
    c->partial -= st->msg_cap;
    free(st->msg);
    st->msg = NULL;
    st->msg_cap = 0;
    st->in_msg = 0;
    st->skipping = 1;
    finish_internal(st, 8, m);
    return 0;
  }
  c->partial += more;
  st->msg = grown;
  st->msg_cap = cap;
  return 1;
}

static int on_data_chunk(nghttp2_session *sess, uint8_t flags, int32_t id, const uint8_t *data, size_t len, void *ud) {
  (void)flags;
  Conn *c = ud;
  Stream *st = ng.session_get_stream_user_data(sess, id);
  if (!st || st->rejected || st->skipping) return 0;
  while (len) {
    if (!st->in_msg) {
      size_t take = 5 - (size_t)st->pfx_have;
      if (take > len) take = len;
      memcpy(st->pfx + st->pfx_have, data, take);
      st->pfx_have += (int)take;
      data += take;
      len -= take;
      if (st->pfx_have < 5) break;
      st->pfx_have = 0;
      uint32_t mlen = (uint32_t)st->pfx[1] << 24 | (uint32_t)st->pfx[2] << 16 | (uint32_t)st->pfx[3] << 8 | st->pfx[4];
      if (st->pfx[0] != 0) {
        st->skipping = 1;
        finish_internal(st, st->pfx[0] == 1 ? 12 : 13,
                        st->pfx[0] == 1 ? "compression is not supported" : "invalid message flags");
        return 0;
      }
      if (mlen > c->srv->max_msg) {
        char m[160];
        snprintf(m, sizeof m, "received message larger than max (%u vs. %zu bytes)", mlen, c->srv->max_msg);
        st->skipping = 1;
        finish_internal(st, 8, m);
        return 0;
      }
      if (mlen == 0) {
        push_event(c->srv, EV_MSG, st, NULL, 0);
        continue;
      }
      /* The declared length is only a claim: memory grows with the bytes that actually arrive. */
      if (!grow_message(c, st, mlen < MSG_FIRST_ALLOC ? mlen : MSG_FIRST_ALLOC)) return 0;
      st->msg_len = mlen;
      st->msg_have = 0;
      st->in_msg = 1;
    } else {
      size_t take = st->msg_len - st->msg_have;
      if (take > len) take = len;
      if (st->msg_have + take > st->msg_cap) {
        size_t cap = st->msg_cap * 2;
        if (cap < st->msg_have + take) cap = st->msg_have + take;
        if (cap > st->msg_len) cap = st->msg_len;
        if (!grow_message(c, st, cap)) return 0;
      }
      memcpy(st->msg + st->msg_have, data, take);
      st->msg_have += take;
      data += take;
      len -= take;
      if (st->msg_have == st->msg_len) {
        c->partial -= st->msg_cap; /* complete: the app owns it from here */
        st->msg_cap = 0;
        push_event(c->srv, EV_MSG, st, st->msg, st->msg_len);
        st->msg = NULL;
        st->in_msg = 0;
      }
    }
  }
  return 0;
}

static int on_frame_send(nghttp2_session *sess, const nghttp2_frame *f, void *ud) {
  (void)ud;
  if (f->hd.type != NGHTTP2_HEADERS || !(f->hd.flags & NGHTTP2_FLAG_END_STREAM)) return 0;
  Stream *st = ng.session_get_stream_user_data(sess, f->hd.stream_id);
  /* We ended our side before the client ended its own: tell it to stop sending. */
  if (st && !st->remote_closed) ng.submit_rst_stream(sess, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR);
  return 0;
}

static int on_stream_close(nghttp2_session *sess, int32_t id, uint32_t code, void *ud) {
  (void)code, (void)ud;
  Stream *st = ng.session_get_stream_user_data(sess, id);
  if (st) stream_detach(st);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* connections                                                               */

static void conn_want_out(Conn *c, int on) {
  if (c->epollout == on) return;
  struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0), .data.ptr = c};
  epoll_ctl(c->srv->epfd, EPOLL_CTL_MOD, c->fd, &e);
  c->epollout = on;
}

/* > 0 bytes, 0 end of stream, -1 would block, -2 error */
static ssize_t conn_recv(Conn *c, uint8_t *buf, size_t len) {
  if (c->ssl) {
    int n = ossl.SSL_read(c->ssl, buf, (int)len);
    if (n > 0) return n;
    int e = ossl.SSL_get_error(c->ssl, n);
    if (e == ET_SSL_ERROR_WANT_READ || e == ET_SSL_ERROR_WANT_WRITE) return -1;
    ossl.ERR_clear_error();
    return e == ET_SSL_ERROR_ZERO_RETURN ? 0 : -2;
  }
  for (;;) {
    ssize_t n = recv(c->fd, buf, len, 0);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? -1 : -2;
  }
}

static ssize_t conn_send(Conn *c, const uint8_t *buf, size_t len) {
  if (c->ssl) {
    int n = ossl.SSL_write(c->ssl, buf, len > INT32_MAX ? INT32_MAX : (int)len);
    if (n > 0) return n;
    int e = ossl.SSL_get_error(c->ssl, n);
    if (e == ET_SSL_ERROR_WANT_READ || e == ET_SSL_ERROR_WANT_WRITE) return -1;
    ossl.ERR_clear_error();
    return -2;
  }
  for (;;) {
    ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? -1 : -2;
  }
}

static void tls_handshake(Conn *c) {
  ossl.ERR_clear_error();
  int r = ossl.SSL_do_handshake(c->ssl);
  if (r == 1) {
    c->handshaking = 0;
    conn_want_out(c, 0);
    return;
  }
  int e = ossl.SSL_get_error(c->ssl, r);
  if (e == ET_SSL_ERROR_WANT_READ) conn_want_out(c, 0);
  else if (e == ET_SSL_ERROR_WANT_WRITE) conn_want_out(c, 1);
  else c->dead = 1;
  ossl.ERR_clear_error();
}

static void pending_set(Conn *c, int on) {
  ServerObject *srv = c->srv;
  if (c->pending_in == on) return;
  c->pending_in = on;
  if (on) {
    c->pprev = NULL;
    c->pnext = srv->pend;
    if (srv->pend) srv->pend->pprev = c;
    srv->pend = c;
  } else {
    if (c->pprev) c->pprev->pnext = c->pnext;
    else srv->pend = c->pnext;
    if (c->pnext) c->pnext->pprev = c->pprev;
    c->pprev = c->pnext = NULL;
  }
}

/* Read what the connection has, up to READ_BUDGET. If the budget ran out, or OpenSSL holds decrypted bytes that
 * level-triggered epoll cannot report (SSL_pending), the connection goes on srv->pend and is read again next
 * iteration (which then does not wait in epoll_wait). */
static void conn_readable(Conn *c) {
  c->served = c->srv->iter;
  int more = 0;
  if (c->dead) goto out;
  if (c->handshaking) {
    tls_handshake(c);
    if (c->handshaking || c->dead) goto out;
  }
  uint8_t *buf = c->srv->rbuf;
  size_t got = 0;
  int calls = 0, drained = 0;
  while (got < READ_BUDGET && calls < READ_CALLS) {
    calls++;
    ssize_t n = conn_recv(c, buf, RBUF_SIZE);
    if (n == -1) {
      drained = 1;
      break;
    }
    if (n <= 0) {
      c->dead = 1;
      goto out;
    }
    got += (size_t)n;
    c->last_active = c->srv->now;
    if (ng.session_mem_recv(c->sess, buf, (size_t)n) < 0) { /* protocol error, bad preface, ... */
      c->dead = 1;
      goto out;
    }
    if (!c->ssl && (size_t)n < RBUF_SIZE) { /* a short read: the socket is empty for now */
      drained = 1;
      break;
    }
  }
  more = !drained || (c->ssl && ossl.SSL_pending(c->ssl) > 0);
out:
  pending_set(c, more);
}

static void conn_append(Conn *c, const uint8_t *p, size_t n) {
  if (c->outlen + n > c->outcap) {
    size_t cap = c->outcap ? c->outcap : 64 * 1024;
    while (cap < c->outlen + n) cap *= 2;
    c->out = xrealloc(c->out, cap);
    c->outcap = cap;
  }
  memcpy(c->out + c->outlen, p, n);
  c->outlen += n;
}

static void conn_flush(Conn *c) {
  if (c->dead || c->handshaking) return;
  for (;;) {
    while (c->outoff < c->outlen) {
      ssize_t w = conn_send(c, c->out + c->outoff, c->outlen - c->outoff);
      if (w == -1) {
        conn_want_out(c, 1);
        return;
      }
      if (w < 0) {
        c->dead = 1;
        return;
      }
      c->outoff += (size_t)w;
    }
    c->outoff = c->outlen = 0;
    while (c->outlen < FLUSH_AT) {
      const uint8_t *p;
      ssize_t n = ng.session_mem_send(c->sess, &p);
      if (n < 0) {
        c->dead = 1;
        return;
      }
      if (n == 0) break;
      conn_append(c, p, (size_t)n);
    }
    if (c->outlen == 0) break;
  }
  if (c->outcap > 4 * FLUSH_AT) { /* give back what a large message grew */
    free(c->out);
    c->out = NULL;
    c->outcap = 0;
  }
  conn_want_out(c, 0);
}

static nghttp2_session_callbacks *make_callbacks(void) {
  nghttp2_session_callbacks *cbs;
  if (ng.session_callbacks_new(&cbs) != 0) return NULL;
  ng.session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
  ng.session_callbacks_set_on_header_callback(cbs, on_header);
  ng.session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
  ng.session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
  ng.session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
  ng.session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
  ng.session_callbacks_set_data_source_read_length_callback(cbs, read_length_cb);
  return cbs;
}

static void format_peer(const struct sockaddr_storage *sa, char *out) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->ss_family == AF_INET) {
    const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
    snprintf(out, PEER_LEN, "ipv4:%s:%u", host, ntohs(s->sin_port));
  } else if (sa->ss_family == AF_INET6) {
    const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
    snprintf(out, PEER_LEN, "ipv6:[%s]:%u", host, ntohs(s->sin6_port));
  } else {
    snprintf(out, PEER_LEN, "unknown");
  }
}

static void conn_new(ServerObject *srv, int fd, const struct sockaddr_storage *sa) {
  Conn *c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return;
  }
  c->srv = srv;
  c->fd = fd;
  c->accepted_at = c->last_active = srv->now;
  format_peer(sa, c->peer);
  int rv = ng_options ? ng_session_server_new2(&c->sess, srv->cbs, c, ng_options)
                      : ng.session_server_new(&c->sess, srv->cbs, c);
  if (rv != 0) {
    free(c);
    close(fd);
    return;
  }
  nghttp2_settings_entry iv[4] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 1024},
                                  {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 8 << 20},
                                  {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, 1 << 20},
                                  {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)srv->max_hdr}};
  ng.submit_settings(c->sess, NGHTTP2_FLAG_NONE, iv, 4);
  ng.session_set_local_window_size(c->sess, NGHTTP2_FLAG_NONE, 0, 16 << 20);
  if (srv->ssl_ctx) {
    c->ssl = ossl.SSL_new(srv->ssl_ctx);
    if (!c->ssl || ossl.SSL_set_fd(c->ssl, fd) != 1) {
      if (c->ssl) ossl.SSL_free(c->ssl);
      ng.session_del(c->sess);
      free(c);
      close(fd);
      return;
    }
    ossl.SSL_set_accept_state(c->ssl);
    c->handshaking = 1;
  }
  struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
  epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &e);
  c->next = srv->conns;
  if (srv->conns) srv->conns->prev = c;
  srv->conns = c;
  srv->nconns++;
  STAT_ADD(srv->n_open, 1);
}

static void conn_close(Conn *c) {
  ServerObject *srv = c->srv;
  pending_set(c, 0);
  while (c->streams) stream_detach(c->streams);
  ng.session_del(c->sess);
  if (c->ssl) ossl.SSL_free(c->ssl);
  epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  free(c->out);
  if (c->prev) c->prev->next = c->next;
  else srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  srv->nconns--;
  STAT_ADD(srv->n_open, -1);
  free(c);
}

#define ACCEPT_BATCH 64  /* connections accepted per loop iteration: a connect flood cannot hold the IO thread */
#define ACCEPT_PAUSE 0.1 /* seconds without accepting after an error that retrying at once would only repeat */
#define GOAWAY_LINGER 1.0 /* seconds a connection closing on its idle timeout may take to flush its GOAWAY */

static void listen_watch(ServerObject *srv, int on) {
  struct epoll_event e = {.events = on ? EPOLLIN : 0, .data.ptr = &srv->listen_fd};
  epoll_ctl(srv->epfd, EPOLL_CTL_MOD, srv->listen_fd, &e);
}

static void accept_some(ServerObject *srv) {
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(srv->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if ((errno == EMFILE || errno == ENFILE) && srv->reserve_fd >= 0) {
        /* Out of descriptors. The listener stays readable (level-triggered), so retrying would spin: spend the
         * reserve descriptor to take the connection off the queue and close it, then take the reserve back. */
        STAT_ADD(srv->n_emfile, 1);
        close(srv->reserve_fd);
        fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
          close(fd);
          STAT_ADD(srv->n_refused, 1);
        }
        srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && srv->reserve_fd >= 0) continue;
      } else if (errno == EMFILE || errno == ENFILE) {
        STAT_ADD(srv->n_emfile, 1);
      }
      /* no reserve (or another error such as ENOBUFS): stop watching the listener for a moment */
      if (srv->reserve_fd < 0) srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      listen_watch(srv, 0);
      srv->accept_at = srv->now + ACCEPT_PAUSE;
      return;
    }
    if (srv->nconns >= srv->max_conns) { /* over the cap: closed at once, before any TLS or HTTP/2 work */
      close(fd);
      STAT_ADD(srv->n_refused, 1);
      continue;
    }
    STAT_ADD(srv->n_accepted, 1);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conn_new(srv, fd, &sa);
  }
}

/* Timers, checked every sweep_every seconds: the handshake timeout (TLS handshake and the client's connection
 * preface), the idle timeout (no open stream, and nothing received since the last one ended), and the end of an
 * accept pause. */
static void sweep(ServerObject *srv) {
  double now = srv->now;
  srv->next_sweep = now + srv->sweep_every;
  if (srv->accept_at > 0 && now >= srv->accept_at && srv->listen_fd >= 0) {
    srv->accept_at = 0;
    listen_watch(srv, 1);
  }
  for (Conn *c = srv->conns; c; c = c->next) {
    if (c->dead) continue;
    if (!c->preface_done) {
      if (now - c->accepted_at >= srv->handshake_timeout) {
        c->dead = 1;
        STAT_ADD(srv->n_handshake_timeouts, 1);
      }
    } else if (c->goaway_sent) {
      if (now >= c->close_at) c->dead = 1; /* the client does not read its GOAWAY */
    } else if (c->nstreams == 0 && now - c->last_active >= srv->idle_timeout && !srv->stopping) {
      /* GOAWAY with the last stream processed: nothing is in flight, and nghttp2 wants no more reads once it is
       * sent, so the connection closes as soon as it is flushed */
      ng.submit_goaway(c->sess, NGHTTP2_FLAG_NONE, ng.session_get_last_proc_stream_id(c->sess), NGHTTP2_NO_ERROR,
                       NULL, 0);
      c->goaway_sent = 1;
      c->close_at = now + GOAWAY_LINGER;
      STAT_ADD(srv->n_idle_closed, 1);
    }
  }
}

/* ------------------------------------------------------------------------ */
/* dispatch to Python (IO thread, takes the GIL once per batch)              */

static CallObject *make_call(ServerObject *srv, Stream *st) {
  CallObject *call = PyObject_GC_New(CallObject, &CallType);
  if (!call) return NULL;
  Py_INCREF(srv);
  call->srv = srv;
  call->st = NULL;
  call->user = Py_NewRef(Py_None);
  call->metadata = NULL;
  call->method = PyUnicode_DecodeLatin1(st->path, (Py_ssize_t)strlen(st->path), "replace");
  call->meta = st->meta;
  call->nmeta = st->nmeta;
  st->meta = NULL;
  st->nmeta = 0;
  memcpy(call->peer, st->peer, PEER_LEN);
  PyObject_GC_Track((PyObject *)call);
  if (!call->method) {
    Py_DECREF(call);
    return NULL;
  }
  pthread_mutex_lock(&srv->mu);
  call->st = st;
  pthread_mutex_unlock(&srv->mu);
  st->call = call;
  return call;
}

static void handler_failed(ServerObject *srv, PyObject *method, Stream *st) {
  PyErr_WriteUnraisable(method);
  if (st->closed) return;
  const char *m = "the server's handler raised an exception";
  char *enc = percent_encode(m, strlen(m));
  int w = 0;
  pthread_mutex_lock(&srv->mu);
  finish_locked(srv, st, 13, enc, 0, &w);
  pthread_mutex_unlock(&srv->mu);
}

static void dispatch(ServerObject *srv) {
  if (!srv->nev) return;
  pthread_mutex_lock(&srv->mu);
  srv->in_dispatch = 1;
  pthread_mutex_unlock(&srv->mu);
  PyEval_RestoreThread(srv->tstate);
  for (size_t i = 0; i < srv->nev; i++) {
    Event *e = &srv->ev[i];
    Stream *st = e->st;
    if (e->type == EV_CLOSE) {
      CallObject *call = st->call;
      int cancel;
      pthread_mutex_lock(&srv->mu);
      if (call) call->st = NULL;
      unlink_dirty_locked(srv, st);
      cancel = call && !st->finished_by_app;
      pthread_mutex_unlock(&srv->mu);
      if (cancel) {
        PyObject *args[1] = {(PyObject *)call};
        PyObject *r = PyObject_Vectorcall(srv->on_cancel, args, 1, NULL);
        if (r) Py_DECREF(r);
        else PyErr_WriteUnraisable(srv->on_cancel);
      }
      st->call = NULL;
      Py_XDECREF(call);
      stream_free(st);
      continue;
    }
    /* Reset, or its connection closed, before the application saw this: nobody is left to answer, so no work is
     * started (its EV_CLOSE follows, and cancels the call if an earlier event created one). */
    if (st->closed || (st->conn && st->conn->dead)) {
      free(e->data);
      continue;
    }
    if (!st->call && !make_call(srv, st)) {
      PyErr_WriteUnraisable(NULL);
      free(e->data);
      continue;
    }
    PyObject *r;
    PyObject *method;
    if (e->type == EV_MSG) {
      PyObject *data = PyBytes_FromStringAndSize((const char *)e->data, (Py_ssize_t)e->len);
      free(e->data);
      method = srv->on_message;
      if (!data) {
        handler_failed(srv, method, st);
        continue;
      }
      PyObject *args[2] = {(PyObject *)st->call, data};
      r = PyObject_Vectorcall(method, args, 2, NULL);
      Py_DECREF(data);
    } else {
      method = srv->on_half_close;
      PyObject *args[1] = {(PyObject *)st->call};
      r = PyObject_Vectorcall(method, args, 1, NULL);
    }
    if (r) Py_DECREF(r);
    else handler_failed(srv, method, st);
  }
  srv->nev = 0;
  srv->tstate = PyEval_SaveThread();
}

/* Apply what send()/finish() queued. */
static void apply_dirty(ServerObject *srv) {
  size_t n = 0;
  pthread_mutex_lock(&srv->mu);
  srv->in_dispatch = 0;
  srv->wake_pending = 0;
  for (Stream *st = srv->dirty_head; st; st = st->dnext) {
    if (n == srv->capwork) {
      srv->capwork = srv->capwork ? srv->capwork * 2 : 64;
      srv->work = xrealloc(srv->work, srv->capwork * sizeof *srv->work);
    }
    srv->work[n++] = st;
  }
  for (size_t i = 0; i < n; i++) {
    Stream *st = srv->work[i];
    st->dirty = 0;
    st->dprev = st->dnext = NULL;
    if (st->pq_head) {
      if (st->oq_tail) st->oq_tail->next = st->pq_head;
      else st->oq_head = st->pq_head;
      st->oq_tail = st->pq_tail;
      st->pq_head = st->pq_tail = NULL;
    }
    if (st->finish_req) st->fin_ready = 1;
    if (st->overflow) st->do_reset = 1;
  }
  srv->dirty_head = NULL;
  pthread_mutex_unlock(&srv->mu);

  for (size_t i = 0; i < n; i++) {
    Stream *st = srv->work[i];
    if (st->do_reset && !st->reset_sent) {
      /* Reset the stream (ENHANCE_YOUR_CALM: grpc clients report RESOURCE_EXHAUSTED) and drop what it queued; the
       * application gets on_cancel when the stream closes, its send() and finish() already return False. */
      st->reset_sent = 1;
      free_outbufs(st->oq_head);
      st->oq_head = st->oq_tail = NULL;
      pthread_mutex_lock(&srv->mu);
      if (st->conn) st->conn->queued -= st->queued;
      st->queued = 0;
      pthread_mutex_unlock(&srv->mu);
      if (!st->closed && st->conn) {
        ng.submit_rst_stream(st->conn->sess, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_ENHANCE_YOUR_CALM);
        STAT_ADD(srv->n_buffer_resets, 1);
      }
      continue;
    }
    if (st->closed || !st->conn || st->trailers_sent || st->reset_sent) continue;
    nghttp2_session *sess = st->conn->sess;
    if (st->headers_sent) {
      ng.session_resume_data(sess, st->id);
    } else if (st->oq_head) {
      nghttp2_nv h[2] = {MAKE_NV(":status", "200", 3), MAKE_NV("content-type", "application/grpc", 16)};
      nghttp2_data_provider prd = {.source.ptr = st, .read_callback = data_read_cb};
      if (ng.submit_response(sess, st->id, h, 2, &prd) == 0) st->headers_sent = 1;
    } else if (st->fin_ready) { /* Trailers-Only */
      char code[16];
      int cl = snprintf(code, sizeof code, "%d", st->fin_code);
      const char *m = st->fin_msg ? st->fin_msg : "";
      nghttp2_nv h[4] = {MAKE_NV(":status", "200", 3), MAKE_NV("content-type", "application/grpc", 16),
                         MAKE_NV("grpc-status", code, (size_t)cl), MAKE_NV("grpc-message", m, strlen(m))};
      ng.submit_response(sess, st->id, h, m[0] ? 4 : 3, NULL);
      st->headers_sent = st->trailers_sent = 1;
    }
  }
}

static void begin_stop(ServerObject *srv, double grace) {
  srv->stopping = 1;
  srv->deadline = now_s() + (grace > 0 ? grace : 0);
  if (srv->listen_fd >= 0) {
    epoll_ctl(srv->epfd, EPOLL_CTL_DEL, srv->listen_fd, NULL);
    close(srv->listen_fd);
    srv->listen_fd = -1;
  }
  /* A shutdown notice (GOAWAY with the largest stream id): clients open no new streams here, and none of those
   * already on the wire is refused. Refusing some (a GOAWAY with the last processed id) makes grpc clients retry
   * them transparently, and grpcio 1.85 can then leave a streaming call hanging past its deadline. Calls still
   * open at the deadline are reset and the connection closed. */
  for (Conn *c = srv->conns; c; c = c->next)
    if (!c->handshaking) ng.submit_goaway(c->sess, NGHTTP2_FLAG_NONE, 0x7fffffff, NGHTTP2_NO_ERROR, NULL, 0);
}

static void *io_main(void *arg) {
  ServerObject *srv = arg;
  PyGILState_STATE gs = PyGILState_Ensure();
  srv->tstate = PyEval_SaveThread();
  struct epoll_event evs[128];
  srv->now = now_s();
  srv->next_sweep = srv->now + srv->sweep_every;
  for (;;) {
    int timeout = -1;
    if (srv->nev || srv->pend) {
      timeout = 0;
    } else {
      double wake_at = srv->conns || srv->accept_at > 0 ? srv->next_sweep : -1;
      if (srv->stopping) {
        double at = srv->deadline < srv->now + 0.05 ? srv->deadline : srv->now + 0.05;
        if (wake_at < 0 || at < wake_at) wake_at = at;
      }
      if (wake_at >= 0) {
        double left = wake_at - now_s();
        timeout = left <= 0 ? 0 : (int)(left * 1000) + 1;
      }
    }
    int n = epoll_wait(srv->epfd, evs, 128, timeout);
    if (n < 0) n = 0;
    srv->now = now_s();
    srv->iter++;
    for (int i = 0; i < n; i++) {
      void *p = evs[i].data.ptr;
      if (p == (void *)&srv->listen_fd) {
        if (srv->listen_fd >= 0) accept_some(srv);
      } else if (p == (void *)&srv->evfd) {
        uint64_t v;
        ssize_t r = read(srv->evfd, &v, sizeof v);
        (void)r;
      } else {
        Conn *c = p;
        /* The client shut its side or the connection failed: whatever it still has queued is not read, as no
         * answer could reach it (a request followed by a close must not start work). */
        if (evs[i].events & (EPOLLRDHUP | EPOLLERR | EPOLLHUP)) c->dead = 1;
        else if (evs[i].events & EPOLLIN) conn_readable(c);
        else if (c->handshaking && (evs[i].events & EPOLLOUT)) conn_readable(c);
      }
    }
    Conn *pnext;
    for (Conn *c = srv->pend; c; c = pnext) { /* left over from the last iteration and not read in this one */
      pnext = c->pnext;
      if (c->served != srv->iter) conn_readable(c);
    }
    dispatch(srv);
    apply_dirty(srv);

    pthread_mutex_lock(&srv->mu);
    int stop_req = srv->stop_req;
    double grace = srv->grace;
    pthread_mutex_unlock(&srv->mu);
    if (stop_req && !srv->stopping) begin_stop(srv, grace);
    if (srv->now >= srv->next_sweep) sweep(srv);
    if (srv->stopping && !srv->hard && now_s() >= srv->deadline) {
      srv->hard = 1;
      for (Conn *c = srv->conns; c; c = c->next)
        if (!c->handshaking)
          for (Stream *st = c->streams; st; st = st->cnext)
            ng.submit_rst_stream(c->sess, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_CANCEL);
    }

    Conn *next;
    for (Conn *c = srv->conns; c; c = next) {
      next = c->next;
      conn_flush(c);
      int idle = c->outoff == c->outlen;
      if (c->dead || (!c->handshaking && idle && !ng.session_want_read(c->sess) && !ng.session_want_write(c->sess)) ||
          (srv->stopping && (srv->hard || c->handshaking || (idle && c->nstreams == 0))))
        conn_close(c);
    }
    if (srv->stopping && !srv->conns && !srv->nev) break;
  }
  PyEval_RestoreThread(srv->tstate);
  PyGILState_Release(gs);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Call type                                                                 */

static PyObject *Call_send(CallObject *self, PyObject *arg) {
  ServerObject *srv = self->srv;
  Py_buffer b;
  if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
  size_t len = (size_t)b.len;
  if (len > srv->max_msg || len > UINT32_MAX) {
    PyBuffer_Release(&b);
    char m[160];
    snprintf(m, sizeof m, "response message larger than max (%zu vs. %zu bytes)", len, srv->max_msg);
    char *enc = percent_encode(m, strlen(m));
    int w = 0;
    pthread_mutex_lock(&srv->mu);
    if (self->st) finish_locked(srv, self->st, 8, enc, 0, &w);
    else free(enc);
    pthread_mutex_unlock(&srv->mu);
    if (w) wake(srv);
    Py_RETURN_FALSE;
  }
  OutBuf *ob = malloc(sizeof *ob + 5 + len);
  if (!ob) {
    PyBuffer_Release(&b);
    return PyErr_NoMemory();
  }
  ob->next = NULL;
  ob->len = 5 + len;
  ob->off = 0;
  ob->data[0] = 0;
  ob->data[1] = (uint8_t)(len >> 24);
  ob->data[2] = (uint8_t)(len >> 16);
  ob->data[3] = (uint8_t)(len >> 8);
  ob->data[4] = (uint8_t)len;
  memcpy(ob->data + 5, b.buf, len);
  PyBuffer_Release(&b);
  int queued = 0, w = 0;
  pthread_mutex_lock(&srv->mu);
  Stream *st = self->st;
  if (st && st->conn && !st->finish_req) {
    Conn *c = st->conn;
    /* Bounded buffering: a client that does not read (a zero flow-control window) must not make the server hold
     * all the application sends. A message always fits when nothing else is queued (on the stream, and on the
     * connection); beyond max_buffered_bytes per connection, or half of it per stream (so that one stalled stream
     * leaves room for the others), the call fails: the IO thread resets the stream and drops what it queued.
     * Not counted: what nghttp2 and the connection's write buffer hold, which does not grow with what the
     * application sends (at most one DATA frame of 1 MiB, and FLUSH_AT plus a frame). */
    if ((st->queued && st->queued + ob->len > srv->max_buf_stream) ||
        (c->queued && c->queued + ob->len > srv->max_buf)) {
      st->overflow = 1;
      st->finish_req = 1; /* finish() and later send()s return False; on_cancel follows the reset */
      w = mark_dirty_locked(srv, st);
    } else {
      if (st->pq_tail) st->pq_tail->next = ob;
      else st->pq_head = ob;
      st->pq_tail = ob;
      st->queued += ob->len;
      c->queued += ob->len;
      w = mark_dirty_locked(srv, st);
      queued = 1;
    }
  }
  pthread_mutex_unlock(&srv->mu);
  if (!queued) free(ob);
  if (w) wake(srv);
  return PyBool_FromLong(queued);
}

static PyObject *Call_finish(CallObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"code", "message", NULL};
  int code;
  const char *msg = "";
  Py_ssize_t msglen = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "i|s#:finish", kwlist, &code, &msg, &msglen)) return NULL;
  ServerObject *srv = self->srv;
  char *enc = percent_encode(msg, (size_t)msglen);
  if (!enc) return PyErr_NoMemory();
  int done = 0, w = 0;
  pthread_mutex_lock(&srv->mu);
  if (self->st) done = finish_locked(srv, self->st, code, enc, 1, &w);
  else free(enc);
  pthread_mutex_unlock(&srv->mu);
  if (w) wake(srv);
  return PyBool_FromLong(done);
}

static PyObject *Call_get_metadata(CallObject *self, void *closure) {
  (void)closure;
  if (!self->metadata) {
    PyObject *list = PyList_New((Py_ssize_t)self->nmeta);
    if (!list) return NULL;
    for (size_t i = 0; i < self->nmeta; i++) {
      const char *k = self->meta[2 * i], *v = self->meta[2 * i + 1];
      PyObject *t = Py_BuildValue("(NN)", PyUnicode_DecodeLatin1(k, (Py_ssize_t)strlen(k), NULL),
                                  PyUnicode_DecodeLatin1(v, (Py_ssize_t)strlen(v), NULL));
      if (!t) {
        Py_DECREF(list);
        return NULL;
      }
      PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    self->metadata = list;
  }
  return Py_NewRef(self->metadata);
}

static PyObject *Call_get_peer(CallObject *self, void *closure) {
  (void)closure;
  return PyUnicode_FromString(self->peer);
}

static PyObject *Call_get_user(CallObject *self, void *closure) {
  (void)closure;
  return Py_NewRef(self->user);
}

static int Call_set_user(CallObject *self, PyObject *v, void *closure) {
  (void)closure;
  Py_XSETREF(self->user, Py_NewRef(v ? v : Py_None));
  return 0;
}

static int Call_traverse(CallObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->user);
  Py_VISIT(self->srv);
  return 0;
}

static int Call_clear(CallObject *self) {
  Py_CLEAR(self->user);
  return 0;
}

static void Call_dealloc(CallObject *self) {
  PyObject_GC_UnTrack(self);
  /* self->st is NULL here: a live stream holds a reference to its call */
  Py_CLEAR(self->user);
  Py_CLEAR(self->method);
  Py_CLEAR(self->metadata);
  free_meta(self->meta, self->nmeta);
  Py_CLEAR(self->srv);
  PyObject_GC_Del(self);
}

static PyMethodDef Call_methods[] = {
    {"send", (PyCFunction)Call_send, METH_O,
     "send(data) -> bool: queue one response message (thread-safe); False if the call is over"},
    {"finish", (PyCFunction)(void (*)(void))Call_finish, METH_VARARGS | METH_KEYWORDS,
     "finish(code, message='') -> bool: end the call with a gRPC status (thread-safe); False if already over"},
    {NULL, NULL, 0, NULL}};

static PyMemberDef Call_members[] = {{"method", T_OBJECT_EX, offsetof(CallObject, method), READONLY, "the :path"},
                                     {NULL, 0, 0, 0, NULL}};

static PyGetSetDef Call_getset[] = {
    {"metadata", (getter)Call_get_metadata, NULL, "request headers other than pseudo-headers", NULL},
    {"peer", (getter)Call_get_peer, NULL, "the client's address", NULL},
    {"user", (getter)Call_get_user, (setter)Call_set_user, "free slot for the handler's per-call state", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject CallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "embedtriton._h2.Call",
    .tp_basicsize = sizeof(CallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One gRPC call (an HTTP/2 stream).",
    .tp_dealloc = (destructor)Call_dealloc,
    .tp_traverse = (traverseproc)Call_traverse,
    .tp_clear = (inquiry)Call_clear,
    .tp_methods = Call_methods,
    .tp_members = Call_members,
    .tp_getset = Call_getset,
};

/* ------------------------------------------------------------------------ */
/* Server type                                                               */

static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                       unsigned int inlen, void *arg) {
  (void)ssl, (void)arg;
  for (unsigned int i = 0; i < inlen;) {
    unsigned int l = in[i];
    if (i + 1 + l > inlen) break;
    if (l == 2 && in[i + 1] == 'h' && in[i + 2] == '2') {
      *out = in + i + 1;
      *outlen = 2;
      return ET_SSL_TLSEXT_ERR_OK;
    }
    i += 1 + l;
  }
  return ET_SSL_TLSEXT_ERR_ALERT_FATAL;
}

static int ssl_fail(SSL_CTX *ctx, const char *what, const char *path) {
  char buf[256] = "";
  unsigned long e = ossl.ERR_get_error();
  if (e) ossl.ERR_error_string_n(e, buf, sizeof buf);
  ossl.ERR_clear_error();
  ossl.SSL_CTX_free(ctx);
  PyErr_Format(PyExc_ValueError, "TLS: %s %s failed: %s", what, path ? path : "", buf);
  return -1;
}

static int setup_tls(ServerObject *self, PyObject *tls, const char *libpath) {
  PyObject *cert_o, *key_o, *ca_o = Py_None;
  if (!PyArg_ParseTuple(tls, "O&O&|O:tls", PyUnicode_FSConverter, &cert_o, PyUnicode_FSConverter, &key_o, &ca_o))
    return -1;
  int rc = -1;
  PyObject *ca_b = NULL;
  if (ca_o != Py_None && !PyUnicode_FSConverter(ca_o, &ca_b)) goto out;
  if (load_openssl(libpath) < 0) goto out;
  SSL_CTX *ctx = ossl.SSL_CTX_new(ossl.TLS_server_method());
  if (!ctx) {
    PyErr_SetString(PyExc_RuntimeError, "TLS: SSL_CTX_new failed");
    goto out;
  }
  ossl.SSL_CTX_ctrl(ctx, ET_SSL_CTRL_SET_MIN_PROTO_VERSION, ET_TLS1_2_VERSION, NULL);
  ossl.SSL_CTX_ctrl(ctx, ET_SSL_CTRL_MODE, ET_SSL_MODE_ENABLE_PARTIAL_WRITE | ET_SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER,
                    NULL);
  const char *cert = PyBytes_AS_STRING(cert_o), *key = PyBytes_AS_STRING(key_o);
  if (ossl.SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
    ssl_fail(ctx, "loading certificate", cert);
    goto out;
  }
  if (ossl.SSL_CTX_use_PrivateKey_file(ctx, key, ET_SSL_FILETYPE_PEM) != 1 ||
      ossl.SSL_CTX_check_private_key(ctx) != 1) {
    ssl_fail(ctx, "loading private key", key);
    goto out;
  }
  if (ca_b) {
    const char *ca = PyBytes_AS_STRING(ca_b);
    if (ossl.SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) {
      ssl_fail(ctx, "loading client CA", ca);
      goto out;
    }
    ossl.SSL_CTX_set_verify(ctx, ET_SSL_VERIFY_PEER | ET_SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  }
  ossl.SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
  self->ssl_ctx = ctx;
  rc = 0;
out:
  Py_DECREF(cert_o);
  Py_DECREF(key_o);
  Py_XDECREF(ca_b);
  return rc;
}

static int bind_listener(ServerObject *self, const char *host, int port) {
  char hostbuf[256];
  size_t hl = strlen(host);
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']' && hl < sizeof hostbuf) {
    memcpy(hostbuf, host + 1, hl - 2);
    hostbuf[hl - 2] = 0;
    host = hostbuf;
  }
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res, *ai;
  int gai = getaddrinfo(host[0] ? host : NULL, portstr, &hints, &res);
  if (gai != 0) {
    PyErr_Format(PyExc_OSError, "cannot resolve %s: %s", host, gai_strerror(gai));
    return -1;
  }
  int fd = -1, err = 0;
  for (ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0) break;
    err = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    errno = err;
    PyErr_Format(PyExc_OSError, "cannot listen on %s:%d: %s", host, port, strerror(err));
    return -1;
  }
  struct sockaddr_storage sa;
  socklen_t sl = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &sl);
  self->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                              : ((struct sockaddr_in *)&sa)->sin_port);
  self->listen_fd = fd;
  return 0;
}

static PyObject *Server_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  ServerObject *self = (ServerObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  self->listen_fd = self->epfd = self->evfd = self->reserve_fd = -1;
  pthread_mutex_init(&self->mu, NULL);
  pthread_mutex_init(&self->join_mu, NULL);
  (void)args, (void)kw;
  return (PyObject *)self;
}

static int positive(double v, const char *name) {
  if (v > 0) return 0; /* NaN fails this too */
  PyErr_Format(PyExc_ValueError, "%s must be a positive number of seconds", name);
  return -1;
}

static int Server_init(ServerObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {
      "host", "port", "handler", "max_message_bytes", "tls", "libpath",                                 /* positional */
      "max_connections", "idle_timeout", "handshake_timeout", "max_header_list_bytes", "max_buffered_bytes", /* kw */
      NULL};
  const char *host, *libpath = NULL;
  int port;
  PyObject *handler, *tls = Py_None;
  Py_ssize_t max_msg, max_conns = 1024, max_hdr = 16384, max_buf = 64 << 20;
  double idle = 300.0, hs = 10.0;
  if (self->started || self->on_message) {
    PyErr_SetString(PyExc_RuntimeError, "Server.__init__ called twice");
    return -1;
  }
  if (!PyArg_ParseTupleAndKeywords(args, kw, "siOn|Oz$nddnn:Server", kwlist, &host, &port, &handler, &max_msg, &tls,
                                   &libpath, &max_conns, &idle, &hs, &max_hdr, &max_buf))
    return -1;
  if (max_msg < 0) {
    PyErr_SetString(PyExc_ValueError, "max_message_bytes must be >= 0");
    return -1;
  }
  if (max_conns <= 0 || max_conns > INT_MAX) {
    PyErr_SetString(PyExc_ValueError, "max_connections must be a positive int");
    return -1;
  }
  if (max_hdr <= 0 || max_hdr > INT32_MAX) {
    PyErr_SetString(PyExc_ValueError, "max_header_list_bytes must be a positive int below 2**31");
    return -1;
  }
  if (max_buf <= 0) {
    PyErr_SetString(PyExc_ValueError, "max_buffered_bytes must be a positive int");
    return -1;
  }
  if (positive(idle, "idle_timeout") < 0 || positive(hs, "handshake_timeout") < 0) return -1;
  self->max_msg = (size_t)max_msg;
  self->max_conns = (int)max_conns;
  self->idle_timeout = idle;
  self->handshake_timeout = hs;
  self->max_hdr = (size_t)max_hdr;
  self->max_buf = (size_t)max_buf;
  self->max_buf_stream = (size_t)max_buf / 2;
  /* timers are checked this often: a tenth of the shorter timeout, between 10 ms and 1 s */
  double shorter = idle < hs ? idle : hs;
  self->sweep_every = shorter / 10 < 0.01 ? 0.01 : shorter / 10 > 1.0 ? 1.0 : shorter / 10;
  if (load_nghttp2(libpath) < 0) return -1;
  if (!(self->on_message = PyObject_GetAttrString(handler, "on_message"))) return -1;
  if (!(self->on_half_close = PyObject_GetAttrString(handler, "on_half_close"))) return -1;
  if (!(self->on_cancel = PyObject_GetAttrString(handler, "on_cancel"))) return -1;
  if (tls != Py_None && setup_tls(self, tls, libpath) < 0) return -1;
  if (bind_listener(self, host, port) < 0) return -1;
  self->epfd = epoll_create1(EPOLL_CLOEXEC);
  self->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  self->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  self->rbuf = malloc(RBUF_SIZE);
  self->cbs = make_callbacks();
  if (self->epfd < 0 || self->evfd < 0 || self->reserve_fd < 0 || !self->rbuf || !self->cbs) {
    PyErr_SetString(PyExc_OSError, "cannot set up the IO thread (epoll/eventfd/memory)");
    return -1;
  }
  struct epoll_event e = {.events = EPOLLIN, .data.ptr = &self->listen_fd};
  epoll_ctl(self->epfd, EPOLL_CTL_ADD, self->listen_fd, &e);
  e.data.ptr = &self->evfd;
  epoll_ctl(self->epfd, EPOLL_CTL_ADD, self->evfd, &e);
  Py_INCREF(self); /* the IO thread's reference, dropped by stop() after joining */
  self->thread_ref = 1;
  int err = pthread_create(&self->thread, NULL, io_main, self);
  if (err) {
    Py_DECREF(self);
    self->thread_ref = 0;
    errno = err;
    PyErr_SetFromErrno(PyExc_OSError);
    return -1;
  }
  self->started = 1;
  self->reg_next = registry;
  registry = self;
  return 0;
}

static void registry_remove(ServerObject *s) {
  for (ServerObject **p = &registry; *p; p = &(*p)->reg_next)
    if (*p == s) {
      *p = s->reg_next;
      return;
    }
}

static int do_stop(ServerObject *self, double grace) {
  if (!self->started) return 0;
  pthread_mutex_lock(&self->mu);
  if (!self->stop_req) {
    self->stop_req = 1;
    self->grace = grace;
  }
  pthread_mutex_unlock(&self->mu);
  wake(self);
  if (pthread_equal(pthread_self(), self->thread)) return 0; /* from a handler: the thread stops after this batch */
  int drop = 0;
  Py_BEGIN_ALLOW_THREADS;
  pthread_mutex_lock(&self->join_mu);
  if (!self->joined) {
    pthread_join(self->thread, NULL);
    self->joined = 1;
    drop = 1;
  }
  pthread_mutex_unlock(&self->join_mu);
  Py_END_ALLOW_THREADS;
  if (drop) {
    registry_remove(self);
    if (self->thread_ref) {
      self->thread_ref = 0;
      Py_DECREF(self); /* the caller still holds one */
    }
  }
  return 0;
}

static PyObject *Server_stop(ServerObject *self, PyObject *args) {
  double grace = 0;
  if (!PyArg_ParseTuple(args, "|d:stop", &grace)) return NULL;
  do_stop(self, grace);
  Py_RETURN_NONE;
}

static int Server_traverse(ServerObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->on_message);
  Py_VISIT(self->on_half_close);
  Py_VISIT(self->on_cancel);
  return 0;
}

static int Server_clear(ServerObject *self) {
  Py_CLEAR(self->on_message);
  Py_CLEAR(self->on_half_close);
  Py_CLEAR(self->on_cancel);
  return 0;
}

static void Server_dealloc(ServerObject *self) {
  PyObject_GC_UnTrack(self);
  /* a running IO thread holds a reference, so the thread is not running here */
  Server_clear(self);
  if (self->listen_fd >= 0) close(self->listen_fd);
  if (self->epfd >= 0) close(self->epfd);
  if (self->evfd >= 0) close(self->evfd);
  if (self->reserve_fd >= 0) close(self->reserve_fd);
  if (self->cbs) ng.session_callbacks_del(self->cbs);
  if (self->ssl_ctx) ossl.SSL_CTX_free(self->ssl_ctx);
  free(self->ev);
  free(self->work);
  free(self->rbuf);
  pthread_mutex_destroy(&self->mu);
  pthread_mutex_destroy(&self->join_mu);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Server_stats(ServerObject *self, PyObject *unused) {
  (void)unused;
  return Py_BuildValue("{s:L,s:K,s:K,s:K,s:K,s:K,s:K}", "connections", (long long)STAT_GET(self->n_open),
                       "buffer_resets", (unsigned long long)STAT_GET(self->n_buffer_resets), "accepted",
                       (unsigned long long)STAT_GET(self->n_accepted), "refused",
                       (unsigned long long)STAT_GET(self->n_refused), "emfile",
                       (unsigned long long)STAT_GET(self->n_emfile), "idle_closed",
                       (unsigned long long)STAT_GET(self->n_idle_closed), "handshake_timeouts",
                       (unsigned long long)STAT_GET(self->n_handshake_timeouts));
}

static PyMethodDef Server_methods[] = {
    {"stop", (PyCFunction)Server_stop, METH_VARARGS,
     "stop(grace=0): stop accepting, let calls finish for up to grace seconds, cancel the rest, join the IO thread"},
    {"stats", (PyCFunction)Server_stats, METH_NOARGS,
     "stats() -> dict of counters: connections (open now), accepted, refused (over max_connections or out of file "
     "descriptors), emfile (accepts that failed for want of descriptors), idle_closed, handshake_timeouts, "
     "buffer_resets (calls reset for queueing more than max_buffered_bytes allows)"},
    {NULL, NULL, 0, NULL}};

static PyMemberDef Server_members[] = {
    {"port", T_INT, offsetof(ServerObject, port), READONLY, "the bound port"}, {NULL, 0, 0, 0, NULL}};

static PyTypeObject ServerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "embedtriton._h2.Server",
    .tp_basicsize = sizeof(ServerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Server(host, port, handler, max_message_bytes, tls=None, libpath=None, *, max_connections=1024, "
              "idle_timeout=300.0, handshake_timeout=10.0, max_header_list_bytes=16384, "
              "max_buffered_bytes=67108864): gRPC over HTTP/2 on one IO thread.",
    .tp_new = Server_new,
    .tp_init = (initproc)Server_init,
    .tp_dealloc = (destructor)Server_dealloc,
    .tp_traverse = (traverseproc)Server_traverse,
    .tp_clear = (inquiry)Server_clear,
    .tp_methods = Server_methods,
    .tp_members = Server_members,
};

/* atexit: stop servers nobody stopped, so no IO thread touches a finalizing interpreter */
static PyObject *stop_all(PyObject *mod, PyObject *unused) {
  (void)mod, (void)unused;
  while (registry) {
    ServerObject *s = registry;
    Py_INCREF(s);
    do_stop(s, 0);
    registry_remove(s); /* in case do_stop could not join */
    Py_DECREF(s);
  }
  Py_RETURN_NONE;
}

static PyObject *library(PyObject *mod, PyObject *args, PyObject *kw) {
  (void)mod;
  static char *kwlist[] = {"libpath", NULL};
  const char *libpath = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|z:library", kwlist, &libpath)) return NULL;
  if (load_nghttp2(libpath) < 0) return NULL;
  return Py_BuildValue("{s:s,s:s,s:O,s:O}", "path", ng_info.path, "version", ng_info.version, "reset_rate_limit",
                       ng_info.reset_rate_limit ? Py_True : Py_False, "max_continuations",
                       ng_info.max_continuations ? Py_True : Py_False);
}

static PyMethodDef module_methods[] = {
    {"_stop_all", stop_all, METH_NOARGS, "stop every running server (registered with atexit)"},
    {"library", (PyCFunction)(void (*)(void))library, METH_VARARGS | METH_KEYWORDS,
     "library(libpath=None) -> dict: the libnghttp2 in use (loaded now if no Server loaded it yet): path, version, "
     "reset_rate_limit and max_continuations (whether its rapid-reset and CONTINUATION-flood limits are set)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "embedtriton._h2",
                                        "Minimal gRPC-over-HTTP/2 server transport on libnghttp2.", -1,
                                        module_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__h2(void) {
  if (PyType_Ready(&ServerType) < 0 || PyType_Ready(&CallType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  Py_INCREF(&ServerType);
  Py_INCREF(&CallType);
  if (PyModule_AddObject(m, "Server", (PyObject *)&ServerType) < 0 ||
      PyModule_AddObject(m, "Call", (PyObject *)&CallType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  PyObject *atexit = PyImport_ImportModule("atexit");
  PyObject *fn = atexit ? PyObject_GetAttrString(m, "_stop_all") : NULL;
  PyObject *r = fn ? PyObject_CallMethod(atexit, "register", "O", fn) : NULL;
  Py_XDECREF(r);
  Py_XDECREF(fn);
  Py_XDECREF(atexit);
  if (!r) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
