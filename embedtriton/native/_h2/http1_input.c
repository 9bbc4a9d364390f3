/* An HTTP/1.1 connection's input buffer (IO thread), and max_buffered_bytes, the budget of request
 * bytes held across connections: a buffer starts at H1_READ bytes and grows (doubling) only for a
 * request that does not fit in it, within the budget; it goes back to H1_READ once that request is
 * taken out of it. What the budget counts is in h1_incoming(). */
#include "http1.h"

#include <stdio.h>

/* What counts against max_buffered_bytes, across connections: what their input buffers grew to
 * beyond their first H1_READ (a request larger than that arriving: memory follows the bytes
 * received, never a declared length) and the requests read but not yet handed to Python (held). */
static size_t h1_incoming(HttpServerObject* srv)
{
  return (size_t)(STAT_GET(srv->g_input) + STAT_GET(srv->g_held));
}

static size_t beyond_first(size_t cap)
{
  return cap > H1_READ ? cap - H1_READ : 0;
}

/* c's input buffer made cap bytes (freed at 0), with the count of what buffers grew to. */
static void in_resize(HConn* c, size_t cap)
{
  STAT_ADD(c->srv->g_input, (int64_t)beyond_first(cap) - (int64_t)beyond_first(c->incap));
  if (cap) {
    c->in = xrealloc(c->in, cap);
  } else {
    free(c->in);
    c->in = NULL;
  }
  c->incap = cap;
}

/* The size c's input buffer keeps once `taken` more bytes are taken out of it: one grown for a
 * large request goes back to its first H1_READ when what is left fits well in that. */
static size_t in_kept(HConn* c, size_t taken)
{
  return c->incap > H1_READ && c->inlen - c->inoff - taken <= H1_READ / 2 ? H1_READ : c->incap;
}

void h1_in_shrink(HConn* c)
{
  size_t keep = in_kept(c, 0), left = c->inlen - c->inoff;
  if (keep == c->incap) return;
  memmove(c->in, c->in + c->inoff, left);
  c->inoff = 0;
  c->inlen = left;
  in_resize(c, keep);
}

/* Whether `more` request bytes fit within max_buffered_bytes, once `less` are given back. If not,
 * the request arriving on c is refused (503, after the answers before it; what c held is freed). */
static int within_budget(HConn* c, size_t more, size_t less)
{
  HttpServerObject* srv = c->srv;
  if (h1_incoming(srv) - less + more <= srv->max_buffered) return 1;
  char m[200];
  snprintf(m, sizeof m,
           "the server holds more than %zu bytes of incoming requests (max_buffered_bytes); "
           "retry later",
           srv->max_buffered);
  STAT_ADD(srv->n_budget, 1);
  h1_refuse(c, 503, m);
  return 0;
}

int h1_in_room(HConn* c)
{
  size_t want = H1_READ_MIN; /* free room wanted, or the rest of a body if that is less */
  if (c->in_body) {
    size_t rest = c->head.scan + c->body_want - (c->inlen - c->inoff);
    if (rest && rest < want) want = rest;
  }
  if (c->incap - c->inlen >= want) return 1;
  if (c->inoff > 0 && c->inoff >= c->inlen / 2) { /* compact first */
    memmove(c->in, c->in + c->inoff, c->inlen - c->inoff);
    c->inlen -= c->inoff;
    c->inoff = 0;
  }
  if (c->incap - c->inlen >= want) return 1;
  size_t cap = c->incap ? c->incap : H1_READ;
  while (cap - c->inlen < H1_READ) cap *= 2;
  size_t grown = beyond_first(cap) - beyond_first(c->incap);
  if (grown && !within_budget(c, grown, 0)) return 0;
  in_resize(c, cap);
  return 1;
}

int h1_in_take(HConn* c, size_t total)
{
  return within_budget(c, total, c->incap - in_kept(c, total));
}

void h1_in_free(HConn* c)
{
  in_resize(c, 0);
}
