/* The Python type embedtriton._h2.Server: TLS setup, the listening socket, the
 * IO thread's start and stop, counters; and the registry of running servers,
 * stopped at exit. */
#include "h2.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <structmember.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Server type                                                               */

static ServerObject* registry; /* servers whose IO thread is running */

static int alpn_select(SSL* ssl, const unsigned char** out, unsigned char* outlen,
                       const unsigned char* in, unsigned int inlen, void* arg)
{
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

static int ssl_fail(SSL_CTX* ctx, const char* what, const char* path)
{
  char buf[256] = "";
  unsigned long e = ossl.ERR_get_error();
  if (e) ossl.ERR_error_string_n(e, buf, sizeof buf);
  ossl.ERR_clear_error();
  ossl.SSL_CTX_free(ctx);
  PyErr_Format(PyExc_ValueError, "TLS: %s %s failed: %s", what, path ? path : "", buf);
  return -1;
}

/* The TLS context of a server (also HttpServer's): tls is (certificate chain, private key[, client
 * CA]); h2: negotiate "h2" by ALPN (refusing clients that offer no h2). NULL with an exception. */
SSL_CTX* tls_context(PyObject* tls, const char* libpath, int h2)
{
  PyObject *cert_o, *key_o, *ca_o = Py_None;
  if (!PyArg_ParseTuple(tls, "O&O&|O:tls", PyUnicode_FSConverter, &cert_o, PyUnicode_FSConverter,
                        &key_o, &ca_o))
    return NULL;
  SSL_CTX* rc = NULL;
  PyObject* ca_b = NULL;
  if (ca_o != Py_None && !PyUnicode_FSConverter(ca_o, &ca_b)) goto out;
  if (load_openssl(libpath) < 0) goto out;
  SSL_CTX* ctx = ossl.SSL_CTX_new(ossl.TLS_server_method());
  if (!ctx) {
    PyErr_SetString(PyExc_RuntimeError, "TLS: SSL_CTX_new failed");
    goto out;
  }
  ossl.SSL_CTX_ctrl(ctx, ET_SSL_CTRL_SET_MIN_PROTO_VERSION, ET_TLS1_2_VERSION, NULL);
  ossl.SSL_CTX_ctrl(ctx, ET_SSL_CTRL_MODE,
                    ET_SSL_MODE_ENABLE_PARTIAL_WRITE | ET_SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER,
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
    const char* ca = PyBytes_AS_STRING(ca_b);
    if (ossl.SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) {
      ssl_fail(ctx, "loading client CA", ca);
      goto out;
    }
    ossl.SSL_CTX_set_verify(ctx, ET_SSL_VERIFY_PEER | ET_SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  }
  if (h2) ossl.SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
  rc = ctx;
out:
  Py_DECREF(cert_o);
  Py_DECREF(key_o);
  Py_XDECREF(ca_b);
  return rc;
}

/* A listening socket on host:port (the first address it resolves to): *fd, and the port bound in
 * *bound; -1 with an exception. */
int listen_on(const char* host, int port, int* fd_out, int* bound)
{
  char hostbuf[256];
  size_t hl = strlen(host);
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']' && hl < sizeof hostbuf) {
    memcpy(hostbuf, host + 1, hl - 2);
    hostbuf[hl - 2] = 0;
    host = hostbuf;
  }
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE},
                  *res, *ai;
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
  getsockname(fd, (struct sockaddr*)&sa, &sl);
  *bound = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6*)&sa)->sin6_port
                                          : ((struct sockaddr_in*)&sa)->sin_port);
  *fd_out = fd;
  return 0;
}

static PyObject* Server_new(PyTypeObject* type, PyObject* args, PyObject* kw)
{
  ServerObject* self = (ServerObject*)type->tp_alloc(type, 0);
  if (!self) return NULL;
  self->listen_fd = self->epfd = self->evfd = self->reserve_fd = -1;
  pthread_mutex_init(&self->mu, NULL);
  pthread_mutex_init(&self->join_mu, NULL);
  pthread_mutex_init(&self->io_mu, NULL);
  (void)args, (void)kw;
  return (PyObject*)self;
}

static int positive(double v, const char* name)
{
  if (v > 0) return 0; /* NaN fails this too */
  PyErr_Format(PyExc_ValueError, "%s must be a positive number of seconds", name);
  return -1;
}

static int Server_init(ServerObject* self, PyObject* args, PyObject* kw)
{
  static char* kwlist[] = {"host",
                           "port",
                           "handler",
                           "max_message_bytes",
                           "tls",
                           "libpath", /* positional */
                           "max_connections",
                           "idle_timeout",
                           "handshake_timeout",
                           "max_header_list_bytes",
                           "max_buffered_bytes",
                           "max_incoming_bytes", /* kw */
                           NULL};
  const char *host, *libpath = NULL;
  int port;
  PyObject *handler, *tls = Py_None;
  Py_ssize_t max_msg, max_conns = 1024, max_hdr = 16384, max_buf = 64 << 20,
                      max_incoming = 512 << 20;
  double idle = 300.0, hs = 10.0;
  if (self->started || self->on_message) {
    PyErr_SetString(PyExc_RuntimeError, "Server.__init__ called twice");
    return -1;
  }
  if (!PyArg_ParseTupleAndKeywords(args, kw, "siOn|Oz$nddnnn:Server", kwlist, &host, &port,
                                   &handler, &max_msg, &tls, &libpath, &max_conns, &idle, &hs,
                                   &max_hdr, &max_buf, &max_incoming))
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
  if (max_incoming <= 0) {
    PyErr_SetString(PyExc_ValueError, "max_incoming_bytes must be a positive int");
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
  self->max_incoming = (size_t)max_incoming;
  /* timers are checked this often: a tenth of the shorter timeout, between 10 ms and 1 s */
  double shorter = idle < hs ? idle : hs;
  self->sweep_every = shorter / 10 < 0.01 ? 0.01 : shorter / 10 > 1.0 ? 1.0 : shorter / 10;
  if (load_nghttp2(libpath) < 0) return -1;
  if (!(self->on_message = PyObject_GetAttrString(handler, "on_message"))) return -1;
  if (!(self->on_half_close = PyObject_GetAttrString(handler, "on_half_close"))) return -1;
  if (!(self->on_cancel = PyObject_GetAttrString(handler, "on_cancel"))) return -1;
  if (tls != Py_None && !(self->ssl_ctx = tls_context(tls, libpath, 1))) return -1;
  if (listen_on(host, port, &self->listen_fd, &self->port) < 0) return -1;
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

static void registry_remove(ServerObject* s)
{
  for (ServerObject** p = &registry; *p; p = &(*p)->reg_next)
    if (*p == s) {
      *p = s->reg_next;
      return;
    }
}

static int do_stop(ServerObject* self, double grace)
{
  if (!self->started) return 0;
  pthread_mutex_lock(&self->mu);
  if (!self->stop_req) {
    self->stop_req = 1;
    self->grace = grace;
  }
  pthread_mutex_unlock(&self->mu);
  wake(self);
  if (pthread_equal(pthread_self(), self->thread))
    return 0; /* from a handler: the thread stops after this batch */
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

static PyObject* Server_stop(ServerObject* self, PyObject* args)
{
  double grace = 0;
  if (!PyArg_ParseTuple(args, "|d:stop", &grace)) return NULL;
  do_stop(self, grace);
  Py_RETURN_NONE;
}

static int Server_traverse(ServerObject* self, visitproc visit, void* arg)
{
  Py_VISIT(self->on_message);
  Py_VISIT(self->on_half_close);
  Py_VISIT(self->on_cancel);
  return 0;
}

static int Server_clear(ServerObject* self)
{
  Py_CLEAR(self->on_message);
  Py_CLEAR(self->on_half_close);
  Py_CLEAR(self->on_cancel);
  return 0;
}

static void Server_dealloc(ServerObject* self)
{
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
  pthread_mutex_destroy(&self->io_mu);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* Server_stats(ServerObject* self, PyObject* unused)
{
  (void)unused;
  return Py_BuildValue("{s:L,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:L,s:K}", "connections",
                       (long long)STAT_GET(self->n_open), "buffer_resets",
                       (unsigned long long)STAT_GET(self->n_buffer_resets), "accepted",
                       (unsigned long long)STAT_GET(self->n_accepted), "refused",
                       (unsigned long long)STAT_GET(self->n_refused), "emfile",
                       (unsigned long long)STAT_GET(self->n_emfile), "idle_closed",
                       (unsigned long long)STAT_GET(self->n_idle_closed), "handshake_timeouts",
                       (unsigned long long)STAT_GET(self->n_handshake_timeouts), "evicted",
                       (unsigned long long)STAT_GET(self->n_evicted), "written_now",
                       (unsigned long long)STAT_GET(self->n_written_now), "incoming_bytes",
                       (long long)STAT_GET(self->g_partial), "budget_refusals",
                       (unsigned long long)STAT_GET(self->n_budget));
}

static PyMethodDef Server_methods[] = {
    {"stop", (PyCFunction)Server_stop, METH_VARARGS,
     "stop(grace=0): stop accepting, let calls finish for up to grace seconds, cancel the rest, "
     "join the IO thread"},
    {"stats", (PyCFunction)Server_stats, METH_NOARGS,
     "stats() -> dict of counters: connections (open now), accepted, refused (over max_connections "
     "or out of file "
     "descriptors, with a call open on every connection), emfile (accepts that failed for want of "
     "descriptors), "
     "evicted (idle connections closed to admit a new one), idle_closed, handshake_timeouts, "
     "buffer_resets (calls reset for queueing more than max_buffered_bytes allows), written_now "
     "(answers in C written by the thread that made them, the IO thread asleep), budget_refusals "
     "(calls failed for max_incoming_bytes); a gauge: incoming_bytes (bytes of incomplete request "
     "messages held, across connections)"},
    {NULL, NULL, 0, NULL}};

static PyMemberDef Server_members[] = {
    {"port", T_INT, offsetof(ServerObject, port), READONLY, "the bound port"},
    {NULL, 0, 0, 0, NULL}};

PyTypeObject ServerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "embedtriton._h2.Server",
    .tp_basicsize = sizeof(ServerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc =
        "Server(host, port, handler, max_message_bytes, tls=None, libpath=None, *, "
        "max_connections=1024, "
        "idle_timeout=300.0, handshake_timeout=10.0, max_header_list_bytes=16384, "
        "max_buffered_bytes=67108864, max_incoming_bytes=536870912): gRPC over HTTP/2 on one IO "
        "thread. max_buffered_bytes bounds each connection (replies queued, incomplete request "
        "messages), max_incoming_bytes the incomplete request messages of all connections.",
    .tp_new = Server_new,
    .tp_init = (initproc)Server_init,
    .tp_dealloc = (destructor)Server_dealloc,
    .tp_traverse = (traverseproc)Server_traverse,
    .tp_clear = (inquiry)Server_clear,
    .tp_methods = Server_methods,
    .tp_members = Server_members,
};

/* atexit: stop servers nobody stopped, so no IO thread touches a finalizing interpreter */
PyObject* stop_all_servers(PyObject* mod, PyObject* unused)
{
  (void)mod, (void)unused;
  while (registry) {
    ServerObject* s = registry;
    Py_INCREF(s);
    do_stop(s, 0);
    registry_remove(s); /* in case do_stop could not join */
    Py_DECREF(s);
  }
  Py_RETURN_NONE;
}
