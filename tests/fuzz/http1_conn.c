/* libFuzzer target: the HTTP/1.1 server's reading side (_h2/http1_conn.c, http1_parse.c) driven
 * through a real socket, as the IO thread drives it, without the interpreter.
 *
 * The input's first byte picks max_header_bytes, max_body_bytes and max_buffered_bytes (the budget
 * across connections: 512 MiB, or 96 KiB so that requests meet it); the rest is what a client
 * sends, written into a socketpair in pieces cut at points the input chooses (fuzz.h), each piece
 * followed by what the IO thread does: h1_readable (read, parse into requests), the hand-over of
 * the requests (checked, then answered through h1_reply, the C answer path), and the writing of the
 * answers (h1_flush, which also resumes a connection paused for backpressure). The client's side
 * is shut at the end and the connection closed with h1_close.
 *
 * Invariants, besides ASan, UBSan and LeakSanitizer:
 *  - every span of a request (method, URL, header names and values) lies inside its head, and the
 *    head and body inside the request's exactly sized copy; the body has the declared length;
 *  - a refusal is one of the statuses the endpoint answers, with a message;
 *  - what the connection buffers of a head still arriving stays within its raw limit
 *    (head_raw_limit: a small multiple of max_header_bytes), its input buffer within the body
 *    limit and a read, and what counts against max_buffered_bytes within it;
 *  - the same bytes give the same requests whatever the cut points: each run is compared with
 *    the same input sent in one piece (unless the budget refused one: what is buffered when
 *    depends on the cuts);
 *  - once closed, the server's gauges (bytes held, grown input, answers buffered) are back to
 *    zero. */
#include "http1.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"

#define MAX_RECORDS 512

typedef struct {
  uint64_t digest[MAX_RECORDS];
  size_t n;
  int budget;             /* a request was refused for max_buffered_bytes */
  HttpCallObject** calls; /* the stand-ins for the Python calls, freed at the end */
  size_t ncalls, capcalls;
} Run;

static uint64_t fnv(uint64_t h, const void* p, size_t n)
{
  const uint8_t* b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

static void check_span(const HReq* r, Span s, const char* what)
{
  CHECK((size_t)s.off + s.len <= r->head_len, "%s [%u, +%u) past the head (%zu bytes)", what, s.off,
        s.len, r->head_len);
}

/* A request handed over: checked, recorded, and answered as the endpoint would. */
static void take(Run* run, HttpServerObject* srv, HReq* r)
{
  HConn* c = r->conn;
  c->held -= r->head_len + r->body_len; /* (as dispatch does) */
  STAT_ADD(srv->g_held, -(int64_t)(r->head_len + r->body_len));
  uint64_t h = 0xcbf29ce484222325ull;
  if (r->refused) {
    CHECK(r->refused == 400 || r->refused == 408 || r->refused == 411 || r->refused == 413 ||
              r->refused == 431 || r->refused == 503,
          "refused with %d", r->refused);
    CHECK(r->refusal && r->refusal[0], "a refusal without a message");
    if (r->refused == 503) run->budget = 1;
    h = fnv(h, &r->refused, sizeof r->refused);
  } else {
    CHECK(r->blob != NULL, "a request without its bytes");
    CHECK(r->head_len == r->head.scan, "head_len %zu, scan %zu", r->head_len, r->head.scan);
    CHECK(r->body_len == (r->head.length > 0 ? (size_t)r->head.length : 0),
          "body %zu bytes for Content-Length %lld", r->body_len, (long long)r->head.length);
    CHECK(r->head.method.len > 0 && r->head.url.len > 0, "an empty method or URL");
    CHECK(r->head.nfields % 2 == 0, "%zu field spans", r->head.nfields);
    check_span(r, r->head.method, "method");
    check_span(r, r->head.url, "URL");
    h = fnv(h, r->blob + r->head.method.off, r->head.method.len);
    h = fnv(h, r->blob + r->head.url.off, r->head.url.len);
    for (size_t i = 0; i < r->head.nfields; i++) {
      check_span(r, r->head.fields[i], i % 2 ? "header value" : "header name");
      h = fnv(h, r->blob + r->head.fields[i].off, r->head.fields[i].len);
      h = fnv(h, "\n", 1);
    }
    h = fnv(h, r->blob + r->head_len, r->body_len); /* (the body: every byte read under ASan) */
    h = fnv(h, &r->keep_alive, sizeof r->keep_alive);
  }
  if (run->n < MAX_RECORDS) run->digest[run->n++] = h;
  /* the call Python would get, and the answer through the C path */
  HttpCallObject* call = calloc(1, sizeof *call);
  if (!call) abort();
  call->srv = srv;
  call->req = r;
  call->keep_alive = r->keep_alive && !r->refused;
  r->call = call;
  if (run->ncalls == run->capcalls) {
    run->capcalls = run->capcalls ? 2 * run->capcalls : 16;
    run->calls = realloc(run->calls, run->capcalls * sizeof *run->calls);
    if (!run->calls) abort();
  }
  run->calls[run->ncalls++] = call;
  h1_reply((PyObject*)call, r->refused ? r->refused : 200, "", "ok", 2);
}

/* What the IO thread does after a read, until nothing moves: hand over, answer, write (which may
 * resume a paused connection and parse what it had read), and the client reads its answers. */
static void serve(Run* run, HttpServerObject* srv, HConn* c, int client)
{
  for (int round = 0; round < 10000; round++) {
    int moved = srv->ntodo > 0;
    for (size_t i = 0; i < srv->ntodo; i++)
      if (srv->todo[i] && srv->todo[i]->conn) take(run, srv, srv->todo[i]);
    srv->ntodo = 0;
    pthread_mutex_lock(&srv->mu);
    int dirty = srv->dirty_head != NULL;
    srv->dirty_head = NULL;
    c->dirty = 0;
    srv->ngone = srv->ndone = srv->nlost = 0; /* (the stand-in calls are freed at the end) */
    srv->wake_pending = 0;
    pthread_mutex_unlock(&srv->mu);
    if (dirty) h1_flush(c);
    drain(client);
    if (!moved && !dirty) return;
  }
  CHECK(0, "the connection never settles");
}

static void check_buffer(const HConn* c, const HttpServerObject* srv)
{
  size_t waiting = c->inlen - c->inoff, raw = head_raw_limit(srv->max_hdr);
  if (c->in_request && !c->in_body)
    CHECK(waiting <= raw, "%zu bytes of a head buffered (max_header_bytes %zu, raw limit %zu)",
          waiting, srv->max_hdr, raw);
  size_t cap = 2 * (srv->max_body > raw ? srv->max_body : raw) + 4 * H1_READ;
  CHECK(c->incap <= cap, "input buffer of %zu bytes (max_body_bytes %zu)", c->incap, srv->max_body);
  CHECK(STAT_GET(srv->g_input) + STAT_GET(srv->g_held) <= (int64_t)srv->max_buffered,
        "%lld bytes of incoming requests held, over max_buffered_bytes %zu",
        (long long)(STAT_GET(srv->g_input) + STAT_GET(srv->g_held)), srv->max_buffered);
}

static void run_once(Run* run, size_t max_hdr, size_t max_body, size_t max_buffered,
                     const uint8_t* data, size_t n, int cut)
{
  HttpServerObject* srv = calloc(1, sizeof *srv);
  HConn* c = calloc(1, sizeof *c);
  int sv[2];
  if (!srv || !c || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) abort();
  fcntl(sv[0], F_SETFL, O_NONBLOCK);
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  pthread_mutex_init(&srv->mu, NULL);
  srv->epfd = srv->evfd = -1; /* (epoll and wake-ups fail harmlessly: this loop is the IO thread) */
  srv->max_hdr = max_hdr;
  srv->max_body = max_body;
  srv->max_buffered = max_buffered;
  srv->request_timeout = srv->idle_timeout = 30;
  srv->conns = c;
  srv->nconns = 1;
  c->srv = srv;
  c->fd = sv[0];
  Cuts cuts = cuts_from(data, n);
  size_t at = 0;
  int stuck = 0;
  while (at < n && stuck < 4) {
    size_t piece = cut ? cut_next(&cuts, 4096) : n - at;
    if (piece > n - at) piece = n - at;
    ssize_t w = write(sv[1], data + at, piece);
    if (w > 0) at += (size_t)w, stuck = 0;
    else stuck++; /* the server reads no further (refused, closing, paused): so be it */
    h1_readable(c);
    check_buffer(c, srv);
    serve(run, srv, c, sv[1]);
  }
  shutdown(sv[1], SHUT_WR);
  for (int i = 0; i < 3 && !c->dead; i++) {
    h1_readable(c);
    serve(run, srv, c, sv[1]);
  }
  h1_close(c);
  CHECK(srv->nconns == 0, "%d connections left", srv->nconns);
  CHECK(srv->g_held == 0 && srv->g_buffered == 0 && srv->g_input == 0,
        "gauges held %lld, buffered %lld, input %lld after close", (long long)srv->g_held,
        (long long)srv->g_buffered, (long long)srv->g_input);
  close(sv[1]);
  for (size_t i = 0; i < run->ncalls; i++) free(run->calls[i]);
  free(run->calls);
  run->calls = NULL;
  run->ncalls = run->capcalls = 0;
  free(srv->todo);
  free(srv->done);
  free(srv->lost);
  free(srv->gone);
  free(srv->work);
  pthread_mutex_destroy(&srv->mu);
  free(srv);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
  if (size < 1) return 0;
  static const size_t hdr[] = {64, 512, 16384}, body[] = {0, 64, 1 << 20},
                      budget[] = {512u << 20, 96 << 10};
  size_t max_hdr = hdr[data[0] % 3], max_body = body[(data[0] / 3) % 3];
  size_t max_buffered = budget[(data[0] / 9) % 2];
  uint8_t* stream = exact_copy(data + 1, size - 1);
  Run* cut = calloc(1, sizeof(Run));
  Run* whole = calloc(1, sizeof(Run));
  if (!cut || !whole) abort();
  run_once(cut, max_hdr, max_body, max_buffered, stream, size - 1, 1);
  run_once(whole, max_hdr, max_body, max_buffered, stream, size - 1, 0);
  if (!cut->budget && !whole->budget) {
    CHECK(cut->n == whole->n, "%zu requests cut in pieces, %zu sent whole", cut->n, whole->n);
    for (size_t i = 0; i < cut->n; i++)
      CHECK(cut->digest[i] == whole->digest[i], "request %zu differs when cut in pieces", i);
  }
  free(cut);
  free(whole);
  free(stream);
  return 0;
}
