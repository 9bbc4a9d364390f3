/* HTTP/1.1 connections (IO thread): reading (plaintext or TLS) and parsing into requests, kept in
 * order; writing the oldest request's answer. Accepting, closing and the timers are
 * http1_accept.c's. */
#include "http1.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* epoll interest and the read-again list                                    */

static int reading(HConn* c)
{
  return !c->dead && !c->eof && !c->stopped && !c->paused;
}

void h1_update_events(HConn* c)
{
  if (c->dead) return;
  int ev = 0;
  if (c->handshaking || reading(c) || c->linger_until > 0) ev |= EPOLLIN | EPOLLRDHUP;
  if (c->wh) ev |= EPOLLOUT;
  if (ev == c->events) return;
  struct epoll_event e = {.events = (uint32_t)ev, .data.ptr = c};
  epoll_ctl(c->srv->epfd, EPOLL_CTL_MOD, c->fd, &e);
  c->events = ev;
}

void h1_pending_set(HConn* c, int on)
{
  HttpServerObject* srv = c->srv;
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

/* ------------------------------------------------------------------------ */
/* requests                                                                  */

/* r's call (if it was handed over) lost its client before the answer was complete: listed for
 * the next dispatch, which calls its on_gone. Holds mu (r->done is read under it). */
void h1_lost_locked(HttpServerObject* srv, HReq* r)
{
  HttpCallObject* call = r->call;
  if (!call || r->done || call->lost) return;
  call->lost = 1;
  if (srv->nlost == srv->caplost) {
    srv->caplost = srv->caplost ? srv->caplost * 2 : 64;
    srv->lost = xrealloc(srv->lost, srv->caplost * sizeof *srv->lost);
  }
  srv->lost[srv->nlost++] = call;
}

void h1_req_free(HttpServerObject* srv, HReq* r)
{
  pthread_mutex_lock(&srv->mu);
  HttpCallObject* call = r->call;
  h1_lost_locked(srv, r);
  if (call) call->req = NULL;
  OutBuf* q = r->qh;
  size_t queued = 0;
  for (OutBuf* b = q; b; b = b->next) queued += b->len - b->off;
  if (r->conn) r->conn->buffered -= queued;
  STAT_ADD(srv->g_buffered, -(int64_t)queued);
  r->qh = r->qt = NULL;
  r->conn = NULL;
  pthread_mutex_unlock(&srv->mu);
  free_outbufs(q);
  if (r->dispatched && !call) /* still to be handed over: not any more */
    for (size_t i = 0; i < srv->ntodo; i++)
      if (srv->todo[i] == r) srv->todo[i] = NULL;
  if (call) { /* released with the GIL, in the next dispatch */
    if (srv->ndone == srv->capdone) {
      srv->capdone = srv->capdone ? srv->capdone * 2 : 64;
      srv->done = xrealloc(srv->done, srv->capdone * sizeof *srv->done);
    }
    srv->done[srv->ndone++] = call;
  }
  free(r->blob);
  free(r->head.fields);
  free(r->refusal);
  free(r);
}

static HReq* req_new(HConn* c)
{
  HReq* r = calloc(1, sizeof *r);
  if (!r) abort();
  r->conn = c;
  if (c->qtail) c->qtail->next = r;
  else c->qhead = r;
  c->qtail = r;
  c->nreq++;
  return r;
}

/* Hand the waiting requests over (in the next dispatch), MAX_INFLIGHT at most, none while the
 * connection's answers are over BUF_HIGH. */
void h1_schedule(HConn* c)
{
  HttpServerObject* srv = c->srv;
  if (c->dead || __atomic_load_n(&c->buffered, __ATOMIC_RELAXED) >= BUF_HIGH) return;
  for (HReq* r = c->qhead; r && c->ninflight < MAX_INFLIGHT; r = r->next) {
    if (r->dispatched) continue;
    r->dispatched = 1;
    c->ninflight++;
    if (srv->ntodo == srv->captodo) {
      srv->captodo = srv->captodo ? srv->captodo * 2 : 64;
      srv->todo = xrealloc(srv->todo, srv->captodo * sizeof *srv->todo);
    }
    srv->todo[srv->ntodo++] = r;
  }
}

/* Read no further: answer `status` after the requests before, then close. What it read of the
 * request is freed now. */
void h1_refuse(HConn* c, int status, const char* message)
{
  HReq* r = req_new(c);
  r->refused = status;
  r->refusal = strdup(message);
  if (c->head.have_line) { /* the URL (the OpenAI routes' refusals are in OpenAI's shape) */
    r->blob = malloc(c->head.url.len + 1);
    if (!r->blob || !r->refusal) abort();
    memcpy(r->blob, c->in + c->inoff + c->head.url.off, c->head.url.len);
    r->head_len = c->head.url.len;
  }
  c->stopped = 1;
  c->in_request = c->in_body = 0;
  c->inoff = c->inlen = 0;
  h1_in_free(c);
  h1_update_events(c);
  h1_schedule(c);
}

/* Parse what arrived into requests, as long as the connection may queue more. */
void h1_parse(HConn* c)
{
  HttpServerObject* srv = c->srv;
  char err[200];
  while (!c->stopped && !c->dead) {
    if (c->nreq >= MAX_PIPELINED || c->held >= HELD_BYTES ||
        __atomic_load_n(&c->buffered, __ATOMIC_RELAXED) >= BUF_HIGH) {
      if (!c->paused) {
        STAT_ADD(srv->n_paused, 1);
        STAT_ADD(srv->g_paused, 1);
      }
      c->paused = 1;
      break;
    }
    if (!c->in_request) {
      while (c->inoff < c->inlen && (c->in[c->inoff] == '\r' || c->in[c->inoff] == '\n'))
        c->inoff++;
      if (c->inoff == c->inlen) {
        c->inoff = c->inlen = 0;
        break;
      }
      c->in_request = 1;
      head_reset(&c->head);
      c->req_deadline = srv->now + srv->request_timeout;
    }
    const uint8_t* buf = c->in + c->inoff;
    size_t have = c->inlen - c->inoff;
    if (!c->in_body) {
      int rc = head_parse(&c->head, buf, have, srv->max_hdr, srv->max_body, err, sizeof err);
      if (rc == 0) break;
      if (rc > 1) {
        h1_refuse(c, rc, err);
        break;
      }
      c->in_body = 1;
      c->body_want = c->head.length > 0 ? (size_t)c->head.length : 0;
    }
    size_t head_len = c->head.scan;
    if (have - head_len < c->body_want) break;
    size_t total = head_len + c->body_want;
    /* held from now on, copied out of the input buffer, which gives back what it grew to for it */
    if (!h1_in_take(c, total)) break; /* refused: 503 */
    HReq* r = req_new(c);
    r->blob = malloc(total ? total : 1);
    if (!r->blob) abort();
    memcpy(r->blob, buf, total);
    r->head_len = head_len;
    r->body_len = c->body_want;
    r->head = c->head; /* its own copy of the field spans */
    r->head.fields = malloc((c->head.nfields ? c->head.nfields : 1) * sizeof(Span));
    if (!r->head.fields) abort();
    if (c->head.nfields) memcpy(r->head.fields, c->head.fields, c->head.nfields * sizeof(Span));
    r->head.capfields = c->head.nfields;
    r->keep_alive = c->head.minor == 1 ? !c->head.conn_close : c->head.conn_keep_alive;
    c->held += total;
    STAT_ADD(srv->g_held, (int64_t)total);
    STAT_ADD(srv->n_requests, 1);
    c->inoff += total;
    h1_in_shrink(c);
    c->in_request = c->in_body = 0;
    if (!r->keep_alive) c->stopped = 1; /* what follows is not read */
  }
  if (c->inoff == c->inlen) c->inoff = c->inlen = 0;
  h1_schedule(c);
  h1_update_events(c);
}

/* ------------------------------------------------------------------------ */
/* reading and writing                                                       */

/* > 0 bytes, 0 end of stream, -1 would block, -2 error */
static ssize_t h1_recv(HConn* c, uint8_t* buf, size_t len)
{
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

static void tls_handshake(HConn* c)
{
  ossl.ERR_clear_error();
  int r = ossl.SSL_do_handshake(c->ssl);
  if (r == 1) {
    c->handshaking = 0;
  } else {
    int e = ossl.SSL_get_error(c->ssl, r);
    if (e != ET_SSL_ERROR_WANT_READ && e != ET_SSL_ERROR_WANT_WRITE) c->dead = 1;
    ossl.ERR_clear_error();
  }
  h1_update_events(c);
}

/* Read what one connection has, up to READ_BUDGET bytes in READ_CALLS reads; what is left waits on
 * srv->pend for the next iteration. The input buffer starts at H1_READ bytes and grows (doubling,
 * within max_buffered_bytes) only for a request that does not fit in it; of a head, no more than
 * its raw limit is read. */
/* A lingering close (what nginx's lingering_close and Apache's lingering close do): once the
 * answer refusing a request is written, the connection is shut for writing, and what the client
 * still sends (the rest of the refused body, requests pipelined after it) is read and dropped
 * until it closes, for at most LINGER_S. Closing with those bytes unread would make the close a
 * reset, which can destroy the answer in the client's kernel before the client reads it. */
#define LINGER_S 2.0
#define LINGER_READS 16 /* reads of the scrap buffer per event */

static int linger_begin(HConn* c)
{
  if (c->ssl || shutdown(c->fd, SHUT_WR) != 0) return 0; /* (TLS: closed as before) */
  c->linger_until = c->srv->now + LINGER_S;
  h1_update_events(c);
  return 1;
}

static void linger_read(HConn* c)
{
  uint8_t scrap[65536];
  for (int i = 0; i < LINGER_READS; i++) {
    ssize_t n = recv(c->fd, scrap, sizeof scrap, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c->dead = 1; /* the client closed (or is gone): close now */
    return;
  }
}

void h1_readable(HConn* c)
{
  c->served = c->srv->iter;
  int more = 0;
  if (c->dead) goto out;
  if (c->linger_until > 0) {
    linger_read(c);
    goto out;
  }
  if (c->handshaking) {
    tls_handshake(c);
    if (c->handshaking || c->dead) goto out;
  }
  size_t got = 0;
  int calls = 0;
  while (reading(c) && got < READ_BUDGET && calls < READ_CALLS) {
    calls++;
    if (!h1_in_room(c)) break; /* refused: 503 */
    size_t ask = c->incap - c->inlen;
    if (c->in_request && !c->in_body) { /* a head arriving: read no more than its raw limit */
      size_t lim = head_raw_limit(c->srv->max_hdr) + 1, head = c->inlen - c->inoff;
      if (head < lim && lim - head < ask) ask = lim - head;
    }
    ssize_t n = h1_recv(c, c->in + c->inlen, ask);
    if (n == -1) break;
    if (n == -2) {
      c->dead = 1;
      goto out;
    }
    if (n == 0) { /* the client is done sending: answer what it sent, then close */
      c->eof = 1;
      /* a client that closed and one that only shut its sending side look alike here: the
       * work of its requests still under way is cancelled either way (as Go's net/http and
       * nginx take it), and their answers are still written while the connection takes them */
      pthread_mutex_lock(&c->srv->mu);
      for (HReq* r = c->qhead; r; r = r->next) h1_lost_locked(c->srv, r);
      pthread_mutex_unlock(&c->srv->mu);
      c->in_request = c->in_body = 0; /* (a request cut short is dropped whole) */
      h1_update_events(c);
      break;
    }
    got += (size_t)n;
    c->spoke = 1;
    c->inlen += (size_t)n;
    h1_parse(c);
    if (!c->ssl && (size_t)n < ask) break; /* a short read: the socket is empty for now */
    if (c->ssl && ossl.SSL_pending(c->ssl) <= 0 && (size_t)n < ask) break;
    more = 1;
  }
  more = more && reading(c) && (got >= READ_BUDGET || calls >= READ_CALLS);
out:
  h1_pending_set(c, more);
}

static void flush_owned(HConn* c);

/* Write what is queued, if no other thread is writing to c (h1_reply's direct write, which marks
 * c dirty when it is done: it is flushed again then). */
void h1_flush(HConn* c)
{
  HttpServerObject* srv = c->srv;
  if (c->dead || c->handshaking) return;
  pthread_mutex_lock(&srv->mu);
  int mine = !c->writer;
  c->writer = 1;
  pthread_mutex_unlock(&srv->mu);
  if (!mine) return;
  flush_owned(c);
  pthread_mutex_lock(&srv->mu);
  c->writer = 0;
  pthread_mutex_unlock(&srv->mu);
}

/* One write of what c has queued (TLS: its oldest buffer; plaintext: up to 64 buffers at once):
 * the bytes written, -1 when the socket would block, -2 on an error. */
static ssize_t send_queued(HConn* c)
{
  ssize_t w;
  if (c->ssl) {
    OutBuf* b = c->wh;
    size_t n = b->len - b->off;
    int k = ossl.SSL_write(c->ssl, b->data + b->off, n > INT32_MAX ? INT32_MAX : (int)n);
    if (k > 0) w = k;
    else {
      int e = ossl.SSL_get_error(c->ssl, k);
      ossl.ERR_clear_error();
      w = (e == ET_SSL_ERROR_WANT_READ || e == ET_SSL_ERROR_WANT_WRITE) ? -1 : -2;
    }
  } else {
    struct iovec iov[64];
    int n = 0;
    for (OutBuf* b = c->wh; b && n < 64; b = b->next, n++) {
      iov[n].iov_base = b->data + b->off;
      iov[n].iov_len = b->len - b->off;
    }
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    do w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w < 0) w = (errno == EAGAIN || errno == EWOULDBLOCK) ? -1 : -2;
  }
  return w;
}

/* The first `left` bytes of c's queue were written: the buffers they fill are freed. */
static void drop_written(HConn* c, size_t left)
{
  while (left && c->wh) {
    OutBuf* b = c->wh;
    size_t n = b->len - b->off;
    if (left < n) {
      b->off += left;
      left = 0;
    } else {
      left -= n;
      c->wh = b->next;
      free(b);
    }
  }
  if (!c->wh) c->wt = NULL;
}

/* c's oldest request r is answered (all of it queued for writing): it goes; after one that
 * closes the connection (no keep-alive, refused), so do the ones behind it, unanswered. */
static void pop_answered(HConn* c, HReq* r)
{
  HttpServerObject* srv = c->srv;
  c->qhead = r->next;
  if (!c->qhead) c->qtail = NULL;
  c->nreq--;
  c->ninflight--;
  if (!r->keep_alive || r->refused) c->close_after = 1;
  if (r->refused) c->refused_close = 1;
  h1_req_free(srv, r);
  c->idle_since = srv->now;
  if (c->close_after) { /* nothing after it is answered */
    while (c->qhead) {
      HReq* n = c->qhead->next;
      h1_req_free(srv, c->qhead);
      c->qhead = n;
    }
    c->qtail = NULL;
    c->nreq = c->ninflight = 0;
  }
}

/* (h1_flush, holding the writer token) Write what the connection holds; take the oldest request's
 * answer as it comes, and move on to the next request once an answer is complete and written. */
static void flush_owned(HConn* c)
{
  HttpServerObject* srv = c->srv;
  for (;;) {
    size_t wrote = 0;
    int blocked = 0;
    while (c->wh) {
      ssize_t w = send_queued(c);
      if (w == -1) {
        blocked = 1;
        break;
      }
      if (w < 0) {
        c->dead = 1;
        break;
      }
      wrote += (size_t)w;
      drop_written(c, (size_t)w);
    }
    HReq* r = c->qhead;
    int popped = 0;
    OutBuf* got = NULL;
    pthread_mutex_lock(&srv->mu);
    c->buffered -= wrote;
    STAT_ADD(srv->g_buffered, -(int64_t)wrote);
    if (c->aborted) c->dead = 1;
    if (r && !blocked && !c->dead) {
      got = r->qh;
      r->qh = r->qt = NULL;
      if (r->done) popped = 1;
    }
    pthread_mutex_unlock(&srv->mu);
    if (c->dead) break;
    if (got) {
      OutBuf* t = got;
      while (t->next) t = t->next;
      if (c->wt) c->wt->next = got;
      else c->wh = got;
      c->wt = t;
    }
    if (popped) pop_answered(c, r);
    if (blocked || (!got && !popped)) break;
  }
  if (c->dead) return;
  if (c->close_after && !c->wh) {
    if (c->linger_until > 0 || (c->refused_close && !c->eof && linger_begin(c))) return;
    c->dead = 1; /* closed at the end of this iteration */
    return;
  }
  if (c->eof && !c->qhead && !c->wh && !c->in_request) {
    c->dead = 1;
    return;
  }
  if (c->paused && c->nreq < MAX_PIPELINED / 2 && c->held < HELD_BYTES / 2 &&
      __atomic_load_n(&c->buffered, __ATOMIC_RELAXED) < BUF_HIGH / 2) {
    c->paused = 0;
    STAT_ADD(srv->g_paused, -1);
    h1_parse(c); /* what it read before pausing, then its socket again */
    if (reading(c)) h1_pending_set(c, 1);
  }
  h1_schedule(c);
  h1_update_events(c);
}
