/* Connections (IO thread): reading and writing (plaintext or TLS), accepting
 * within the limits (closing an idle connection to make room), and the timers (handshake and idle
 * timeouts, accept pauses). */
#include "h2.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* connections                                                               */

static void conn_want_out(Conn* c, int on)
{
  if (c->epollout == on) return;
  struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0), .data.ptr = c};
  epoll_ctl(c->srv->epfd, EPOLL_CTL_MOD, c->fd, &e);
  c->epollout = on;
}

/* > 0 bytes, 0 end of stream, -1 would block, -2 error */
static ssize_t conn_recv(Conn* c, uint8_t* buf, size_t len)
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

static ssize_t conn_send(Conn* c, const uint8_t* buf, size_t len)
{
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

static void tls_handshake(Conn* c)
{
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

static void pending_set(Conn* c, int on)
{
  ServerObject* srv = c->srv;
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

/* Read what the connection has, up to READ_BUDGET. If the budget ran out, or OpenSSL holds
 * decrypted bytes that level-triggered epoll cannot report (SSL_pending), the connection goes on
 * srv->pend and is read again next iteration (which then does not wait in epoll_wait). */
void conn_readable(Conn* c)
{
  c->served = c->srv->iter;
  int more = 0;
  if (c->dead) goto out;
  if (c->handshaking) {
    tls_handshake(c);
    if (c->handshaking || c->dead) goto out;
  }
  uint8_t* buf = c->srv->rbuf;
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

static void conn_append(Conn* c, const uint8_t* p, size_t n)
{
  if (c->outlen + n > c->outcap) {
    size_t cap = c->outcap ? c->outcap : 64 * 1024;
    while (cap < c->outlen + n) cap *= 2;
    c->out = xrealloc(c->out, cap);
    c->outcap = cap;
  }
  memcpy(c->out + c->outlen, p, n);
  c->outlen += n;
}

void conn_flush(Conn* c)
{
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
      const uint8_t* p;
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

static void format_peer(const struct sockaddr_storage* sa, char* out)
{
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->ss_family == AF_INET) {
    const struct sockaddr_in* s = (const struct sockaddr_in*)sa;
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
    snprintf(out, PEER_LEN, "ipv4:%s:%u", host, ntohs(s->sin_port));
  } else if (sa->ss_family == AF_INET6) {
    const struct sockaddr_in6* s = (const struct sockaddr_in6*)sa;
    inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
    snprintf(out, PEER_LEN, "ipv6:[%s]:%u", host, ntohs(s->sin6_port));
  } else {
    snprintf(out, PEER_LEN, "unknown");
  }
}

void h2_conn_new(ServerObject* srv, int fd, const struct sockaddr_storage* sa)
{
  Conn* c = calloc(1, sizeof *c);
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

void conn_close(Conn* c)
{
  ServerObject* srv = c->srv;
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

#define ACCEPT_BATCH \
  64 /* connections accepted per loop iteration: a connect flood cannot hold the IO thread */
#define ACCEPT_PAUSE \
  0.1 /* seconds without accepting after an error that retrying at once would only repeat */
#define GOAWAY_LINGER \
  1.0 /* seconds a connection closing on its idle timeout may take to flush its GOAWAY */

static void listen_watch(ServerObject* srv, int on)
{
  struct epoll_event e = {.events = on ? EPOLLIN : 0, .data.ptr = &srv->listen_fd};
  epoll_ctl(srv->epfd, EPOLL_CTL_MOD, srv->listen_fd, &e);
}

/* Make room for a new connection: an idle connection (no open stream) is closed, so that idle
 * clients (a flood that connects and sends nothing, pooled channels nobody uses) cannot keep a new
 * client out, and no call in progress is ever cut. Which one: first one that has not finished its
 * TLS handshake and HTTP/2 preface (the cheapest attack on descriptors is to connect and send
 * nothing; a client that spoke keeps its connection through it), then the longest idle, counted
 * from its last_active (its last bytes received or its last call's end, else its accept). It gets
 * GOAWAY (with the last stream processed: none is refused, it has none open; its client reconnects
 * when it next needs to) and is closed at the end of this loop iteration once that is flushed
 * (io_main), not here: later epoll events of this iteration may still point at it. One accepted in
 * this iteration is not a candidate: it has not been read yet (the later ones of a burst would
 * otherwise close the earlier ones, whose requests may be waiting unread). Returns 0 when none is a
 * candidate. */
static int evict_idle(ServerObject* srv)
{
  Conn* victim = NULL;
  int silent =
      0; /* a connection that never spoke is open, a candidate or not (accepted this iteration) */
  for (Conn* c = srv->conns; c; c = c->next) {
    if (c->dead || c->evicted) continue;
    if (!c->preface_done) silent = 1;
    if (c->nstreams > 0 || c->accepted_at >= srv->now) continue;
    if (!victim || c->preface_done < victim->preface_done ||
        (c->preface_done == victim->preface_done && c->last_active < victim->last_active))
      victim = c;
  }
  /* While a flood of silent connections arrives, a client that spoke is never the one closed for
   * it: when only such clients are candidates (the silent ones were all accepted this iteration),
   * the newcomer is refused instead. */
  if (!victim || (victim->preface_done && silent)) return 0;
  if (!victim->handshaking && !victim->goaway_sent)
    ng.submit_goaway(victim->sess, NGHTTP2_FLAG_NONE,
                     ng.session_get_last_proc_stream_id(victim->sess), NGHTTP2_NO_ERROR, NULL, 0);
  victim->evicted = victim->goaway_sent = 1;
  victim->close_at =
      srv->now + GOAWAY_LINGER; /* so that sweep() does not mark it dead (unflushed) before then */
  STAT_ADD(srv->n_evicted, 1);
  return 1;
}

void accept_some(ServerObject* srv)
{
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(srv->listen_fd, (struct sockaddr*)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EMFILE || errno == ENFILE) {
        STAT_ADD(srv->n_emfile, 1);
        /* Out of descriptors: an idle connection closes at the end of this iteration, and the
         * newcomer, left in the queue, is accepted on the next one (the listener stays readable).
         */
        if (evict_idle(srv)) return;
        if (srv->reserve_fd >= 0) {
          /* No connection can make room: refuse the newcomer. Retrying at once would spin (the
           * listener stays readable), so spend the reserve descriptor to take it off the queue and
           * close it, then take the reserve back. */
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
      /* no reserve (or another error such as ENOBUFS): stop watching the listener for a moment */
      if (srv->reserve_fd < 0) srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      listen_watch(srv, 0);
      srv->accept_at = srv->now + ACCEPT_PAUSE;
      if (srv->next_sweep > srv->accept_at)
        srv->next_sweep = srv->accept_at; /* not a sweep later */
      return;
    }
    /* At the cap an idle connection makes room (one per newcomer: it counts until its close at the
     * end of this iteration). When none can, the newcomer is closed at once, before any TLS or
     * HTTP/2 work. */
    if (srv->nconns >= srv->max_conns && !evict_idle(srv)) {
      close(fd);
      STAT_ADD(srv->n_refused, 1);
      continue;
    }
    STAT_ADD(srv->n_accepted, 1);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    h2_conn_new(srv, fd, &sa);
  }
}

/* Timers, checked every sweep_every seconds: the handshake timeout (TLS handshake and the client's
 * connection preface), the idle timeout (no open stream, and nothing received since the last one
 * ended), and the end of an accept pause. */
void sweep(ServerObject* srv)
{
  double now = srv->now;
  srv->next_sweep = now + srv->sweep_every;
  if (srv->accept_at > 0 && now >= srv->accept_at && srv->listen_fd >= 0) {
    srv->accept_at = 0;
    listen_watch(srv, 1);
  }
  for (Conn* c = srv->conns; c; c = c->next) {
    if (c->dead) continue;
    if (!c->preface_done) {
      if (now - c->accepted_at >= srv->handshake_timeout) {
        c->dead = 1;
        STAT_ADD(srv->n_handshake_timeouts, 1);
      }
    } else if (c->goaway_sent) {
      if (now >= c->close_at) c->dead = 1; /* the client does not read its GOAWAY */
    } else if (c->nstreams == 0 && now - c->last_active >= srv->idle_timeout && !srv->stopping) {
      /* GOAWAY with the last stream processed: nothing is in flight, and nghttp2 wants no more
       * reads once it is sent, so the connection closes as soon as it is flushed */
      ng.submit_goaway(c->sess, NGHTTP2_FLAG_NONE, ng.session_get_last_proc_stream_id(c->sess),
                       NGHTTP2_NO_ERROR, NULL, 0);
      c->goaway_sent = 1;
      c->close_at = now + GOAWAY_LINGER;
      STAT_ADD(srv->n_idle_closed, 1);
    }
  }
}
