/* libFuzzer target: the gRPC server's HTTP/2 side (_h2/session.c's nghttp2 callbacks, conn.c's
 * reading and writing, loop.c's h2_apply_dirty, call.c's C answer path) driven through a real
 * socket, as the IO thread drives it, without the interpreter: nghttp2's own fuzz target feeds a
 * server session arbitrary frames; this one feeds ours, with our callbacks, limits and answers.
 *
 * The input's first byte picks max_message_bytes, the responses' compression, how the
 * application answers and the budget across connections (max_incoming_bytes); the rest follows the
 * client connection preface (added here, so that the fuzzer spends its time on frames) and is
 * written into a socketpair in pieces cut at points the input chooses. After each piece:
 * conn_readable (read, nghttp2, our callbacks), the events handed to a stand-in application (which
 * answers through h2_reply, as kserve.c does), apply_dirty and conn_flush (nghttp2 writes); the
 * client reads what comes back. conn_close ends it.
 *
 * Invariants, besides ASan, UBSan and LeakSanitizer (every stream, message and buffer freed):
 *  - a message handed to the application is at most max_message_bytes;
 *  - the connection's count of bytes held for incomplete messages is the sum of its streams' and
 *    within the bound (max_buffered_bytes, at least one max_message_bytes); the server's, across
 *    connections, is the same and within max_incoming_bytes, and back to zero after the close;
 *  - its list of streams has nstreams entries; after the close, none is left and every event has
 *    been handed over. */
#include "h2.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"

static ServerObject* srv;

int LLVMFuzzerInitialize(int* argc, char*** argv)
{
  (void)argc, (void)argv;
  /* The library the transport would load: load_nghttp2 takes EMBEDTRITON_NGHTTP2, else the better
   * of the system's and the Triton runtime's copy (its path from fuzz.py). It words a failure as a
   * Python exception, and no interpreter runs here: one of them must open first. */
  const char* forced = getenv("EMBEDTRITON_NGHTTP2");
  const char* runtime = getenv("EMBEDTRITON_FUZZ_NGHTTP2");
  if (runtime && !runtime[0]) runtime = NULL;
  const char* tried[2] = {forced && forced[0] ? forced : "libnghttp2.so.14",
                          forced && forced[0] ? NULL : runtime};
  int found = 0;
  for (int i = 0; i < 2 && !found; i++) {
    void* h = tried[i] ? dlopen(tried[i], RTLD_NOW | RTLD_LOCAL) : NULL;
    if (h) dlclose(h), found = 1;
  }
  if (!found) {
    fprintf(stderr,
            "h2_session: no libnghttp2 (apt install libnghttp2-14, or the nvidia-pytriton "
            "wheel; EMBEDTRITON_NGHTTP2 names one)\n");
    exit(2);
  }
  if (load_nghttp2(runtime) != 0) exit(2);
  srv = calloc(1, sizeof *srv);
  if (!srv) abort();
  pthread_mutex_init(&srv->mu, NULL);
  pthread_mutex_init(&srv->io_mu, NULL);
  srv->cbs = make_callbacks();
  srv->rbuf = malloc(RBUF_SIZE);
  srv->epfd = epoll_create1(EPOLL_CLOEXEC);
  srv->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  srv->max_hdr = 16 * 1024;
  srv->max_buf = 4 << 20;
  srv->max_buf_stream = 2 << 20;
  srv->listen_fd = -1;
  srv->now = 1.0;
  if (!srv->cbs || !srv->rbuf || srv->epfd < 0 || srv->evfd < 0) abort();
  return 0;
}

typedef struct {
  int mode; /* how the application answers: from the input's first byte */
  int comp;
} App;

static void answer(CallObject* call, const uint8_t* data, size_t len, int how)
{
  if (how == 0) { /* a response message (the first bytes of the request) and OK */
    size_t n = len < 100 ? len : 100;
    uint8_t* payload;
    void* m = h2_reply.message(n, &payload);
    if (!m) abort();
    if (n) memcpy(payload, data, n);
    h2_reply.reply((PyObject*)call, m, 0, "");
  } else if (how == 1) { /* an error, no message */
    h2_reply.reply((PyObject*)call, NULL, 3, "bad request \xff\n");
  } /* else: wait for the half-close */
}

/* The events, as dispatch hands them to Python. */
static void application(App* app)
{
  for (size_t i = 0; i < srv->nev; i++) {
    Event* e = &srv->ev[i];
    Stream* st = e->st;
    CallObject* call = st->call;
    if (e->type == EV_CLOSE) {
      pthread_mutex_lock(&srv->mu);
      if (call) call->st = NULL;
      unlink_dirty_locked(srv, st);
      pthread_mutex_unlock(&srv->mu);
      free(call);
      st->call = NULL;
      stream_free(st);
      continue;
    }
    if (st->closed || (st->conn && st->conn->dead)) {
      free(e->data);
      continue;
    }
    if (!call) {
      call = calloc(1, sizeof *call);
      if (!call) abort();
      call->srv = srv;
      call->comp = app->comp;
      pthread_mutex_lock(&srv->mu);
      call->st = st;
      pthread_mutex_unlock(&srv->mu);
      st->call = call;
    }
    if (e->type == EV_MSG) {
      CHECK(e->len <= srv->max_msg, "a message of %zu bytes over the limit of %zu", e->len,
            srv->max_msg);
      volatile uint8_t sum = 0; /* (every byte read: ASan says if the buffer is short) */
      for (size_t k = 0; k < e->len; k++) sum += e->data[k];
      (void)sum;
      answer(call, e->data, e->len, (app->mode + (e->len ? e->data[0] : 0)) % 3);
      free(e->data);
    } else {
      h2_reply.reply((PyObject*)call, NULL, 0, "");
    }
  }
  srv->nev = 0;
}

static void check_conn(const Conn* c)
{
  size_t partial = 0;
  int n = 0;
  for (const Stream* st = c->streams; st; st = st->cnext, n++) partial += st->msg_cap;
  CHECK(n == c->nstreams, "%d streams listed, nstreams %d", n, c->nstreams);
  CHECK(partial == c->partial, "streams hold %zu bytes, the connection counts %zu", partial,
        c->partial);
  size_t bound = srv->max_buf > srv->max_msg ? srv->max_buf : srv->max_msg;
  CHECK(c->partial <= bound, "%zu bytes of incomplete messages over the bound of %zu", c->partial,
        bound);
  CHECK(STAT_GET(srv->g_partial) == (int64_t)c->partial,
        "the server counts %lld, its connection %zu", (long long)STAT_GET(srv->g_partial),
        c->partial);
  CHECK(c->partial <= srv->max_incoming, "%zu bytes of incomplete messages over max_incoming %zu",
        c->partial, srv->max_incoming);
}

static const char PREFACE[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
  if (size < 1) return 0;
  static const size_t max_msg[] = {16, 4096, 1 << 20};
  srv->max_msg = max_msg[data[0] % 3];
  App app = {(data[0] / 3) % 3, (data[0] / 9) % 3}; /* comp: identity, deflate or gzip */
  srv->max_incoming = data[0] / 27 % 2 ? 4096 : (size_t)512 << 20;
  size_t n = sizeof PREFACE - 1 + size - 1;
  uint8_t* stream = malloc(n);
  if (!stream) abort();
  memcpy(stream, PREFACE, sizeof PREFACE - 1);
  memcpy(stream + sizeof PREFACE - 1, data + 1, size - 1);

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) abort();
  fcntl(sv[0], F_SETFL, O_NONBLOCK);
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  struct sockaddr_storage peer;
  memset(&peer, 0, sizeof peer);
  h2_conn_new(srv, sv[0], &peer);
  Conn* c = srv->conns;
  CHECK(c != NULL && srv->nconns == 1, "the connection was not opened");
  Cuts cuts = cuts_from(data, size);
  size_t at = 0;
  int stuck = 0;
  while (at < n && stuck < 4 && !c->dead) {
    size_t piece = cut_next(&cuts, 8192);
    if (piece > n - at) piece = n - at;
    ssize_t w = write(sv[1], stream + at, piece);
    if (w > 0) at += (size_t)w, stuck = 0;
    else stuck++;
    srv->iter++;
    conn_readable(c);
    check_conn(c);
    application(&app);
    h2_apply_dirty(srv);
    conn_flush(c);
    drain(sv[1]);
    check_conn(c);
  }
  conn_close(c);
  application(&app); /* the streams' close events */
  CHECK(srv->nconns == 0 && srv->conns == NULL, "%d connections left", srv->nconns);
  CHECK(STAT_GET(srv->g_partial) == 0, "%lld bytes of incomplete messages counted after the close",
        (long long)STAT_GET(srv->g_partial));
  pthread_mutex_lock(&srv->mu);
  CHECK(srv->dirty_head == NULL, "a stream left on the dirty list");
  pthread_mutex_unlock(&srv->mu);
  srv->pend = NULL;
  uint64_t v;
  ssize_t r = read(srv->evfd, &v, sizeof v); /* (wake-ups of the answers) */
  (void)r;
  close(sv[1]);
  free(stream);
  return 0;
}
