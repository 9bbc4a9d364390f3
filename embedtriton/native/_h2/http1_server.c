/* The Python type embedtriton._h2.HttpServer: the listener, the IO thread's start and stop,
 * counters; a registry of running servers stopped at exit. */
#include "http1.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <structmember.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* HttpServer                                                                */

static HttpServerObject* registry;

static PyObject* HttpServer_new(PyTypeObject* type, PyObject* args, PyObject* kw)
{
  HttpServerObject* self = (HttpServerObject*)type->tp_alloc(type, 0);
  if (!self) return NULL;
  self->listen_fd = self->epfd = self->evfd = self->reserve_fd = -1;
  pthread_mutex_init(&self->mu, NULL);
  pthread_mutex_init(&self->join_mu, NULL);
  (void)args, (void)kw;
  return (PyObject*)self;
}

static int HttpServer_init(HttpServerObject* self, PyObject* args, PyObject* kw)
{
  static char* kwlist[] = {"host",
                           "port",
                           "on_request",
                           "on_refused",
                           "max_connections",
                           "max_body_bytes",
                           "max_header_bytes",
                           "idle_timeout",
                           "request_timeout",
                           "tls",
                           "libpath",
                           "names",
                           "max_buffered_bytes",
                           NULL};
  const char *host, *libpath = NULL;
  int port, names = 0;
  PyObject *on_request, *on_refused, *tls = Py_None;
  Py_ssize_t max_conns = 1024, max_body = 64 << 20, max_hdr = 16384, max_buffered = 512 << 20;
  double idle = 300.0, req = 30.0;
  if (self->started || self->on_request) {
    PyErr_SetString(PyExc_RuntimeError, "HttpServer.__init__ called twice");
    return -1;
  }
  if (!PyArg_ParseTupleAndKeywords(args, kw, "siOO|$nnnddOzpn:HttpServer", kwlist, &host, &port,
                                   &on_request, &on_refused, &max_conns, &max_body, &max_hdr, &idle,
                                   &req, &tls, &libpath, &names, &max_buffered))
    return -1;
  if (max_conns <= 0 || max_conns > INT_MAX || max_body <= 0 || max_hdr <= 0 ||
      max_hdr > INT32_MAX / 8 || max_buffered <= 0 || !(idle > 0) || !(req > 0)) {
    PyErr_SetString(PyExc_ValueError, "HttpServer: limits must be positive");
    return -1;
  }
  self->max_conns = (int)max_conns;
  self->max_body = (size_t)max_body;
  self->max_hdr = (size_t)max_hdr;
  self->max_buffered = (size_t)max_buffered;
  self->idle_timeout = idle;
  self->request_timeout = req;
  self->names = names;
  double shorter = idle < req ? idle : req; /* timers: a tenth of the shorter, 10 ms to 1 s */
  self->sweep_every = shorter / 10 < 0.01 ? 0.01 : shorter / 10 > 1.0 ? 1.0 : shorter / 10;
  self->on_request = Py_NewRef(on_request);
  self->on_refused = Py_NewRef(on_refused);
  if (tls != Py_None && !(self->ssl_ctx = tls_context(tls, libpath, 0))) return -1;
  if (listen_on(host, port, &self->listen_fd, &self->port) < 0) return -1;
  self->epfd = epoll_create1(EPOLL_CLOEXEC);
  self->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  self->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (self->epfd < 0 || self->evfd < 0 || self->reserve_fd < 0) {
    PyErr_SetString(PyExc_OSError, "cannot set up the IO thread (epoll/eventfd)");
    return -1;
  }
  struct epoll_event e = {.events = EPOLLIN, .data.ptr = &self->listen_fd};
  epoll_ctl(self->epfd, EPOLL_CTL_ADD, self->listen_fd, &e);
  e.data.ptr = &self->evfd;
  epoll_ctl(self->epfd, EPOLL_CTL_ADD, self->evfd, &e);
  Py_INCREF(self); /* the IO thread's reference, dropped by stop() after joining */
  self->thread_ref = 1;
  int err = pthread_create(&self->thread, NULL, h1_main, self);
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

static void registry_remove(HttpServerObject* s)
{
  for (HttpServerObject** p = &registry; *p; p = &(*p)->reg_next)
    if (*p == s) {
      *p = s->reg_next;
      return;
    }
}

static void do_stop(HttpServerObject* self, double grace)
{
  if (!self->started) return;
  pthread_mutex_lock(&self->mu);
  if (!self->stop_req) {
    self->stop_req = 1;
    self->grace = grace;
  }
  pthread_mutex_unlock(&self->mu);
  h1_wake(self);
  if (pthread_equal(pthread_self(), self->thread)) return; /* from a handler */
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
      Py_DECREF(self);
    }
  }
}

static PyObject* HttpServer_stop(HttpServerObject* self, PyObject* args)
{
  double grace = 0;
  if (!PyArg_ParseTuple(args, "|d:stop", &grace)) return NULL;
  do_stop(self, grace);
  Py_RETURN_NONE;
}

static int HttpServer_traverse(HttpServerObject* self, visitproc visit, void* arg)
{
  Py_VISIT(self->on_request);
  Py_VISIT(self->on_refused);
  Py_VISIT(self->fast_ctx);
  return 0;
}

static int HttpServer_clear(HttpServerObject* self)
{
  Py_CLEAR(self->on_request);
  Py_CLEAR(self->on_refused);
  self->fast = NULL;
  Py_CLEAR(self->fast_ctx);
  return 0;
}

static void HttpServer_dealloc(HttpServerObject* self)
{
  PyObject_GC_UnTrack(self);
  HttpServer_clear(self); /* a running IO thread holds a reference: it is not running */
  if (self->listen_fd >= 0) close(self->listen_fd);
  if (self->epfd >= 0) close(self->epfd);
  if (self->evfd >= 0) close(self->evfd);
  if (self->reserve_fd >= 0) close(self->reserve_fd);
  if (self->ssl_ctx) ossl.SSL_CTX_free(self->ssl_ctx);
  free(self->todo);
  free(self->done);
  free(self->lost);
  free(self->work);
  free(self->gone); /* (empty: each call in it holds the server) */
  pthread_mutex_destroy(&self->mu);
  pthread_mutex_destroy(&self->join_mu);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

/* set_fast(capsule, ctx) / set_fast(None, None): the C handler tried before on_request. */
static PyObject* HttpServer_set_fast(HttpServerObject* self, PyObject* args)
{
  PyObject *capsule, *ctx;
  if (!PyArg_ParseTuple(args, "OO:set_fast", &capsule, &ctx)) return NULL;
  const H1FastOps* fast = NULL;
  if (capsule != Py_None) {
    fast = PyCapsule_GetPointer(capsule, H1_FAST_CAPSULE);
    if (fast == NULL) return NULL;
  }
  PyObject* old = self->fast_ctx;
  self->fast_ctx = fast != NULL ? Py_NewRef(ctx) : NULL;
  self->fast = fast;
  Py_XDECREF(old);
  Py_RETURN_NONE;
}

static PyObject* HttpServer_stats(HttpServerObject* self, PyObject* unused)
{
  (void)unused;
  return Py_BuildValue(
      "{s:L,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:L,s:L,s:L,s:K,s:L,s:K}", "connections",
      (long long)STAT_GET(self->n_open), "accepted", (unsigned long long)STAT_GET(self->n_accepted),
      "refused", (unsigned long long)STAT_GET(self->n_refused), "emfile",
      (unsigned long long)STAT_GET(self->n_emfile), "evicted",
      (unsigned long long)STAT_GET(self->n_evicted), "idle_closed",
      (unsigned long long)STAT_GET(self->n_idle_closed), "requests",
      (unsigned long long)STAT_GET(self->n_requests), "request_timeouts",
      (unsigned long long)STAT_GET(self->n_timeouts), "paused",
      (unsigned long long)STAT_GET(self->n_paused), "paused_now",
      (long long)STAT_GET(self->g_paused), "held_bytes", (long long)STAT_GET(self->g_held),
      "buffered_bytes", (long long)STAT_GET(self->g_buffered), "written_now",
      (unsigned long long)STAT_GET(self->n_written_now), "incoming_bytes",
      (long long)(STAT_GET(self->g_input) + STAT_GET(self->g_held)), "budget_refusals",
      (unsigned long long)STAT_GET(self->n_budget));
}

static PyMethodDef HttpServer_methods[] = {
    {"stop", (PyCFunction)HttpServer_stop, METH_VARARGS,
     "stop(grace=0): stop accepting, let requests in progress finish for up to grace seconds, "
     "close every connection, join the IO thread"},
    {"set_fast", (PyCFunction)HttpServer_set_fast, METH_VARARGS,
     "set_fast(capsule, ctx): a C handler (_native._HTTP_FAST) tried before on_request for POSTs "
     "to /v2/models/; set_fast(None, None) removes it"},
    {"stats", (PyCFunction)HttpServer_stats, METH_NOARGS,
     "stats() -> dict of counters: connections (open now), accepted, refused, emfile, evicted, "
     "idle_closed, requests, request_timeouts, paused (times a connection was read no further "
     "for backpressure), budget_refusals (requests refused, 503, for max_buffered_bytes); gauges: "
     "paused_now (connections not read now), held_bytes (requests read, not yet handed over), "
     "incoming_bytes (what counts against max_buffered_bytes: held_bytes and what input buffers "
     "grew to beyond their first 64 KiB), buffered_bytes (answers not yet written); written_now: "
     "answers the thread that made them began to write (the IO thread did not have to wake for "
     "them)"},
    {NULL, NULL, 0, NULL}};

static PyMemberDef HttpServer_members[] = {
    {"port", T_INT, offsetof(HttpServerObject, port), READONLY, "the bound port"},
    {NULL, 0, 0, 0, NULL}};

PyTypeObject HttpServerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "embedtriton._h2.HttpServer",
    .tp_basicsize = sizeof(HttpServerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc =
        "HttpServer(host, port, on_request, on_refused, *, max_connections, max_body_bytes, "
        "max_header_bytes, idle_timeout, request_timeout, tls=None, libpath=None, "
        "names=False, max_buffered_bytes=536870912): HTTP/1.1 on one IO thread.",
    .tp_new = HttpServer_new,
    .tp_init = (initproc)HttpServer_init,
    .tp_dealloc = (destructor)HttpServer_dealloc,
    .tp_traverse = (traverseproc)HttpServer_traverse,
    .tp_clear = (inquiry)HttpServer_clear,
    .tp_methods = HttpServer_methods,
    .tp_members = HttpServer_members,
};

/* atexit: stop servers nobody stopped */
static PyObject* stop_all_http(PyObject* mod, PyObject* unused)
{
  (void)mod, (void)unused;
  while (registry) {
    HttpServerObject* s = registry;
    Py_INCREF(s);
    do_stop(s, 0);
    registry_remove(s);
    Py_DECREF(s);
  }
  Py_RETURN_NONE;
}

static PyMethodDef stop_def = {"_stop_all_http", stop_all_http, METH_NOARGS,
                               "stop every running HttpServer (registered with atexit)"};

int http1_add_types(PyObject* mod)
{
  if (PyType_Ready(&HttpServerType) < 0 || PyType_Ready(&HttpCallType) < 0) return -1;
  Py_INCREF(&HttpServerType);
  Py_INCREF(&HttpCallType);
  if (PyModule_AddObject(mod, "HttpServer", (PyObject*)&HttpServerType) < 0 ||
      PyModule_AddObject(mod, "HttpCall", (PyObject*)&HttpCallType) < 0)
    return -1;
  PyObject* fn = PyCFunction_NewEx(&stop_def, mod, NULL);
  PyObject* atexit = fn ? PyImport_ImportModule("atexit") : NULL;
  PyObject* r = atexit ? PyObject_CallMethod(atexit, "register", "O", fn) : NULL;
  Py_XDECREF(atexit);
  Py_XDECREF(fn);
  if (!r) return -1;
  Py_DECREF(r);
  return 0;
}
