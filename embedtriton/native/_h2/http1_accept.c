/* HTTP/1.1 connections (IO thread), their life: accepting within max_connections (an idle
 * connection makes room), closing, and the timers (request, idle and TLS handshake timeouts,
 * accept pauses). Reading and writing are http1_conn.c's. */
#include "http1.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* accepting, closing, timers                                                */

static void conn_new(HttpServerObject* srv, int fd)
{
  HConn* c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return;
  }
  c->srv = srv;
  c->fd = fd;
  c->accepted_at = c->idle_since = srv->now;
  head_reset(&c->head);
  if (srv->ssl_ctx) {
    c->ssl = ossl.SSL_new(srv->ssl_ctx);
    if (!c->ssl || ossl.SSL_set_fd(c->ssl, fd) != 1) {
      if (c->ssl) ossl.SSL_free(c->ssl);
      free(c);
      close(fd);
      return;
    }
    ossl.SSL_set_accept_state(c->ssl);
    c->handshaking = 1;
  }
  c->events = EPOLLIN | EPOLLRDHUP;
  struct epoll_event e = {.events = (uint32_t)c->events, .data.ptr = c};
  epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &e);
  c->next = srv->conns;
  if (srv->conns) srv->conns->prev = c;
  srv->conns = c;
  srv->nconns++;
  STAT_ADD(srv->n_open, 1);
}

void h1_close(HConn* c)
{
  HttpServerObject* srv = c->srv;
  h1_pending_set(c, 0);
  /* Its requests first: until each is detached (r->conn cleared under mu), a thread answering it
   * can put c back on the dirty list. */
  while (c->qhead) {
    HReq* n = c->qhead->next;
    h1_req_free(srv, c->qhead);
    c->qhead = n;
  }
  free_outbufs(c->wh);
  pthread_mutex_lock(&srv->mu);
  if (c->dirty) { /* off the dirty list: nothing can put it back now */
    for (HConn** p = &srv->dirty_head; *p; p = &(*p)->dnext)
      if (*p == c) {
        *p = c->dnext;
        break;
      }
    c->dirty = 0;
  }
  STAT_ADD(srv->g_buffered, -(int64_t)c->buffered);
  pthread_mutex_unlock(&srv->mu);
  STAT_ADD(srv->g_held, -(int64_t)c->held);
  if (c->paused) STAT_ADD(srv->g_paused, -1);
  if (c->ssl) ossl.SSL_free(c->ssl);
  /* What the client sent that was not read (a refused body, plaintext on a TLS port) would make
   * the close a reset, which can destroy the answer before the client reads it: a little of it is
   * read first. */
  uint8_t scrap[16384];
  for (int i = 0; i < 16 && recv(c->fd, scrap, sizeof scrap, MSG_DONTWAIT) > 0; i++) {
  }
  epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  h1_in_free(c);
  free(c->head.fields);
  if (c->prev) c->prev->next = c->next;
  else srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  srv->nconns--;
  STAT_ADD(srv->n_open, -1);
  free(c);
}

/* Nothing in flight: no request arriving, queued or being answered, nothing left to write. */
int h1_idle(HConn* c)
{
  return !c->dead && !c->in_request && !c->qhead && !c->wh && c->inoff == c->inlen;
}

#define ACCEPT_BATCH 64  /* connections accepted per iteration */
#define ACCEPT_PAUSE 0.1 /* seconds without accepting after an error that would repeat at once */

static void listen_watch(HttpServerObject* srv, int on)
{
  struct epoll_event e = {.events = on ? EPOLLIN : 0, .data.ptr = &srv->listen_fd};
  epoll_ctl(srv->epfd, EPOLL_CTL_MOD, srv->listen_fd, &e);
}

/* At the cap, or out of descriptors: close an idle connection to admit the newcomer, one that
 * never sent anything first (the cheapest attack: connect and send nothing), then the longest
 * idle; none accepted this iteration (not read yet). While silent connections arrive, one that
 * spoke is not closed for them (the newcomer is refused instead). It is closed at the end of this
 * iteration. 0 when none is a candidate. */
static int evict_idle(HttpServerObject* srv)
{
  HConn* victim = NULL;
  int silent = 0;
  for (HConn* c = srv->conns; c; c = c->next) {
    if (c->dead) continue;
    if (!c->spoke) silent = 1;
    if (!h1_idle(c) || c->accepted_at >= srv->now) continue;
    /* (the list runs newest first: of those idle since the same turn, the last, the oldest) */
    if (!victim || c->spoke < victim->spoke ||
        (c->spoke == victim->spoke && c->idle_since <= victim->idle_since))
      victim = c;
  }
  if (!victim || (victim->spoke && silent)) return 0;
  victim->dead = 1;
  STAT_ADD(srv->n_evicted, 1);
  return 1;
}

void h1_accept(HttpServerObject* srv)
{
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EMFILE || errno == ENFILE) {
        STAT_ADD(srv->n_emfile, 1);
        if (evict_idle(srv)) return; /* the newcomer is accepted next iteration */
        if (srv->reserve_fd >= 0) {  /* refuse it: take it off the queue with the reserve */
          close(srv->reserve_fd);
          fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
          if (fd >= 0) {
            close(fd);
            STAT_ADD(srv->n_refused, 1);
          }
          srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
          if (fd >= 0 && srv->reserve_fd >= 0) continue;
        }
      }
      if (srv->reserve_fd < 0) srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      listen_watch(srv, 0);
      srv->accept_at = srv->now + ACCEPT_PAUSE;
      if (srv->next_sweep > srv->accept_at)
        srv->next_sweep = srv->accept_at; /* not a sweep later */
      return;
    }
    if (srv->nconns >= srv->max_conns && !evict_idle(srv)) {
      close(fd);
      STAT_ADD(srv->n_refused, 1);
      continue;
    }
    STAT_ADD(srv->n_accepted, 1);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conn_new(srv, fd);
  }
}

/* Every sweep_every seconds: a TLS handshake or a request not done within request_timeout (the
 * request gets 408 after the answers before it), a connection idle for idle_timeout, the end of an
 * accept pause. */
void h1_sweep(HttpServerObject* srv)
{
  double now = srv->now;
  srv->next_sweep = now + srv->sweep_every;
  if (srv->accept_at > 0 && now >= srv->accept_at && srv->listen_fd >= 0) {
    srv->accept_at = 0;
    listen_watch(srv, 1);
  }
  for (HConn* c = srv->conns; c; c = c->next) {
    if (c->dead) continue;
    if (c->linger_until > 0) {
      if (now >= c->linger_until) c->dead = 1;
    } else if (c->handshaking) {
      if (now - c->accepted_at >= srv->request_timeout) c->dead = 1;
    } else if (c->in_request && !c->stopped && now >= c->req_deadline) {
      STAT_ADD(srv->n_timeouts, 1);
      h1_refuse(c, 408, "the request did not arrive within request_timeout_s");
    } else if (h1_idle(c) && now - c->idle_since >= srv->idle_timeout && !srv->stopping) {
      c->dead = 1;
      STAT_ADD(srv->n_idle_closed, 1);
    }
  }
}
