/* The Python types embedtriton._h2.HttpServer (the listener, the IO thread's start and stop,
 * counters; a registry of running servers stopped at exit) and HttpCall (one request: respond(),
 * or begin() / send() / end() for a chunked stream, from any thread). */
#include "http1.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <structmember.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* HttpCall                                                                  */

static const char* reason(int status)
{
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

/* The status line and the fields ((name, value) str pairs, latin-1), with "Content-Length: n"
 * (n >= 0) or "Transfer-Encoding: chunked" (n < 0) and "Connection: close" without keep-alive,
 * followed by room for `extra` bytes. NULL with an exception. */
static OutBuf* head_of(int status, PyObject* fields, int keep_alive, Py_ssize_t n, size_t extra)
{
  PyObject* seq = PySequence_Fast(fields, "fields must be a sequence of (name, value) pairs");
  if (!seq) return NULL;
  Py_ssize_t nf = PySequence_Fast_GET_SIZE(seq);
  size_t size = 128 + extra;
  for (Py_ssize_t i = 0; i < nf; i++) {
    PyObject* pair = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)) ||
        !PyUnicode_Check(PyTuple_GET_ITEM(pair, 1))) {
      Py_DECREF(seq);
      PyErr_SetString(PyExc_TypeError, "fields must be (str, str) pairs");
      return NULL;
    }
    size += (size_t)PyUnicode_GET_LENGTH(PyTuple_GET_ITEM(pair, 0)) +
            (size_t)PyUnicode_GET_LENGTH(PyTuple_GET_ITEM(pair, 1)) + 4;
  }
  OutBuf* ob = malloc(sizeof *ob + size);
  if (!ob) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return NULL;
  }
  ob->next = NULL;
  ob->off = 0;
  char* p = (char*)ob->data;
  p += sprintf(p, "HTTP/1.1 %d %s\r\n", status, reason(status));
  for (Py_ssize_t i = 0; i < nf; i++) {
    PyObject* pair = PySequence_Fast_GET_ITEM(seq, i);
    for (int k = 0; k < 2; k++) {
      PyObject* s = PyTuple_GET_ITEM(pair, k);
      Py_ssize_t len = PyUnicode_GET_LENGTH(s);
      int kind = PyUnicode_KIND(s);
      const void* data = PyUnicode_DATA(s);
      for (Py_ssize_t j = 0; j < len; j++) {
        Py_UCS4 ch = PyUnicode_READ(kind, data, j);
        *p++ = ch == '\r' || ch == '\n' || ch > 0xff ? ' ' : (char)ch; /* no header injection */
      }
      memcpy(p, k ? "\r\n" : ": ", 2);
      p += 2;
    }
  }
  Py_DECREF(seq);
  if (n >= 0) p += sprintf(p, "Content-Length: %zd\r\n", n);
  else p += sprintf(p, "Transfer-Encoding: chunked\r\n");
  if (!keep_alive) p += sprintf(p, "Connection: close\r\n");
  memcpy(p, "\r\n", 2);
  ob->len = (size_t)(p + 2 - (char*)ob->data);
  return ob;
}

/* Queue ob on the call's request; `final`: the answer is complete. False when the request is over
 * (its connection closed) or its answer was already complete. */
static int enqueue(HttpCallObject* self, OutBuf* ob, int first, int final)
{
  HttpServerObject* srv = self->srv;
  int ok = 0, w = 0;
  pthread_mutex_lock(&srv->mu);
  HReq* r = self->req;
  if (r && r->conn && !r->done && r->answered == first) {
    r->answered = 1;
    r->done = final;
    if (ob) {
      if (r->qt) r->qt->next = ob;
      else r->qh = ob;
      r->qt = ob;
      r->conn->buffered += ob->len;
      STAT_ADD(srv->g_buffered, (int64_t)ob->len);
      ob = NULL;
    }
    w = h1_mark_dirty_locked(srv, r->conn);
    ok = 1;
  }
  pthread_mutex_unlock(&srv->mu);
  free(ob);
  if (w) h1_wake(srv);
  return ok;
}

static PyObject* HttpCall_respond(HttpCallObject* self, PyObject* args)
{
  int status;
  PyObject *fields, *parts;
  if (!PyArg_ParseTuple(args, "iOO:respond", &status, &fields, &parts)) return NULL;
  PyObject* seq = PySequence_Fast(parts, "parts must be a sequence of bytes-like objects");
  if (!seq) return NULL;
  Py_ssize_t np = PySequence_Fast_GET_SIZE(seq);
  Py_buffer* bufs = PyMem_Calloc((size_t)(np ? np : 1), sizeof *bufs);
  Py_ssize_t got = 0, total = 0;
  OutBuf* ob = NULL;
  if (!bufs) {
    PyErr_NoMemory();
    goto out;
  }
  for (; got < np; got++) {
    if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &bufs[got], PyBUF_SIMPLE) < 0)
      goto out;
    total += bufs[got].len;
  }
  ob = head_of(status, fields, self->keep_alive, total, (size_t)total);
  if (!ob) goto out;
  for (Py_ssize_t i = 0; i < np; i++) {
    memcpy(ob->data + ob->len, bufs[i].buf, (size_t)bufs[i].len);
    ob->len += (size_t)bufs[i].len;
  }
out:
  for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
  PyMem_Free(bufs);
  Py_DECREF(seq);
  if (!ob) return NULL;
  return PyBool_FromLong(enqueue(self, ob, 0, 1));
}

/* The caller's reference to call, handed back without the GIL: the IO thread releases it in its
 * next dispatch (or, once it has ended, this thread does, taking the GIL). */
static void give_back(HttpCallObject* call)
{
  HttpServerObject* srv = call->srv;
  int wake = 0, now = 0;
  pthread_mutex_lock(&srv->mu);
  if (!srv->io_done && srv->ngone == srv->capgone) {
    size_t cap = srv->capgone ? srv->capgone * 2 : 64;
    HttpCallObject** grown = realloc(srv->gone, cap * sizeof *grown);
    if (grown != NULL) srv->gone = grown, srv->capgone = cap;
  }
  if (srv->io_done || srv->ngone == srv->capgone) {
    now = 1;
  } else {
    srv->gone[srv->ngone++] = call;
    wake = !srv->wake_pending;
    srv->wake_pending = 1;
  }
  pthread_mutex_unlock(&srv->mu);
  if (wake) h1_wake(srv);
  if (now) {
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF(call);
    PyGILState_Release(g);
  }
}

/* Text at p (without its NUL): the end. (h1_reply, once per answer: no printf.) */
static char* put_text(char* p, const char* text)
{
  size_t n = strlen(text);
  memcpy(p, text, n);
  return p + n;
}

/* n in decimal at p: the end. */
static char* put_size(char* p, size_t n)
{
  char digits[24];
  int k = 0;
  do digits[k++] = (char)('0' + n % 10);
  while ((n /= 10) != 0);
  while (k) *p++ = digits[--k];
  return p;
}

/* The C interface (h2_reply.h, http_reply): a whole answer from any thread, without the GIL.
 * `fields`: preformatted "Name: value\r\n" lines (ours, not a client's); the body is copied.
 * Takes the caller's reference to call over. */
int h1_reply(PyObject* call, int status, const char* fields, const void* body, size_t len)
{
  HttpCallObject* self = (HttpCallObject*)call;
  size_t nf = strlen(fields);
  OutBuf* ob = malloc(sizeof *ob + 160 + nf + len);
  if (!ob) {
    give_back(self);
    return 0;
  }
  ob->next = NULL;
  ob->off = 0;
  char* p = put_text((char*)ob->data, "HTTP/1.1 ");
  p = put_size(p, (size_t)status);
  *p++ = ' ';
  p = put_text(p, reason(status));
  p = put_text(p, "\r\n");
  memcpy(p, fields, nf);
  p += nf;
  p = put_size(put_text(p, "Content-Length: "), len);
  p = put_text(p, self->keep_alive ? "\r\n\r\n" : "\r\nConnection: close\r\n\r\n");
  if (len) memcpy(p, body, len);
  ob->len = (size_t)(p + len - (char*)ob->data);
  int open = enqueue(self, ob, 0, 1);
  give_back(self);
  return open;
}

static PyObject* HttpCall_begin(HttpCallObject* self, PyObject* args)
{
  int status;
  PyObject* fields;
  if (!PyArg_ParseTuple(args, "iO:begin", &status, &fields)) return NULL;
  OutBuf* ob = head_of(status, fields, self->keep_alive, -1, 0);
  if (!ob) return NULL;
  self->streaming = 1;
  return PyBool_FromLong(enqueue(self, ob, 0, 0));
}

static PyObject* HttpCall_send(HttpCallObject* self, PyObject* arg)
{
  Py_buffer b;
  if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
  if (!self->streaming) {
    PyBuffer_Release(&b);
    PyErr_SetString(PyExc_RuntimeError, "send() before begin()");
    return NULL;
  }
  if (b.len == 0) { /* an empty chunk would end the stream */
    PyBuffer_Release(&b);
    return PyBool_FromLong(enqueue(self, NULL, 1, 0));
  }
  OutBuf* ob = malloc(sizeof *ob + 24 + (size_t)b.len);
  if (!ob) {
    PyBuffer_Release(&b);
    return PyErr_NoMemory();
  }
  ob->next = NULL;
  ob->off = 0;
  int n = sprintf((char*)ob->data, "%zx\r\n", (size_t)b.len);
  memcpy(ob->data + n, b.buf, (size_t)b.len);
  memcpy(ob->data + n + b.len, "\r\n", 2);
  ob->len = (size_t)n + (size_t)b.len + 2;
  PyBuffer_Release(&b);
  return PyBool_FromLong(enqueue(self, ob, 1, 0));
}

static PyObject* HttpCall_end(HttpCallObject* self, PyObject* unused)
{
  (void)unused;
  if (!self->streaming) {
    PyErr_SetString(PyExc_RuntimeError, "end() before begin()");
    return NULL;
  }
  OutBuf* ob = malloc(sizeof *ob + 5);
  if (!ob) return PyErr_NoMemory();
  ob->next = NULL;
  ob->off = 0;
  ob->len = 5;
  memcpy(ob->data, "0\r\n\r\n", 5);
  return PyBool_FromLong(enqueue(self, ob, 1, 1));
}

static PyObject* HttpCall_writable(HttpCallObject* self, PyObject* unused)
{
  (void)unused;
  HttpServerObject* srv = self->srv;
  pthread_mutex_lock(&srv->mu);
  HReq* r = self->req;
  int ok = r && r->conn && r->conn->buffered < BUF_HIGH;
  pthread_mutex_unlock(&srv->mu);
  return PyBool_FromLong(ok);
}

static PyObject* HttpCall_abort(HttpCallObject* self, PyObject* unused)
{
  (void)unused;
  HttpServerObject* srv = self->srv;
  int w = 0;
  pthread_mutex_lock(&srv->mu);
  HReq* r = self->req;
  if (r && r->conn) {
    r->conn->aborted = 1;
    w = h1_mark_dirty_locked(srv, r->conn);
  }
  pthread_mutex_unlock(&srv->mu);
  if (w) h1_wake(srv);
  Py_RETURN_NONE;
}

static PyObject* HttpCall_get_open(HttpCallObject* self, void* closure)
{
  (void)closure;
  HttpServerObject* srv = self->srv;
  pthread_mutex_lock(&srv->mu);
  int open = self->req && self->req->conn;
  pthread_mutex_unlock(&srv->mu);
  return PyBool_FromLong(open);
}

/* With the GIL: fn (None: none) is called once if the call's client leaves before its answer is
 * complete; at once if it already has. 0, or -1 with an exception (fn raised). */
int h1_on_gone(PyObject* call, PyObject* fn)
{
  HttpCallObject* self = (HttpCallObject*)call;
  HttpServerObject* srv = self->srv;
  pthread_mutex_lock(&srv->mu);
  int lost = self->lost;
  pthread_mutex_unlock(&srv->mu);
  if (lost && fn != Py_None) { /* (its dispatch found no on_gone, or will find none) */
    PyObject* res = PyObject_CallNoArgs(fn);
    Py_XDECREF(res);
    return res ? 0 : -1;
  }
  Py_XSETREF(self->on_gone, fn != Py_None ? Py_NewRef(fn) : NULL);
  return 0;
}

static PyObject* HttpCall_get_on_gone(HttpCallObject* self, void* closure)
{
  (void)closure;
  return Py_NewRef(self->on_gone ? self->on_gone : Py_None);
}

static int HttpCall_set_on_gone(HttpCallObject* self, PyObject* fn, void* closure)
{
  (void)closure;
  if (fn == NULL || (fn != Py_None && !PyCallable_Check(fn))) {
    PyErr_SetString(PyExc_TypeError, "on_gone must be a callable or None");
    return -1;
  }
  return h1_on_gone((PyObject*)self, fn);
}

static void HttpCall_dealloc(HttpCallObject* self)
{
  Py_CLEAR(self->on_gone);
  HttpServerObject* srv = self->srv;
  pthread_mutex_lock(&srv->mu);
  if (self->req) self->req->call = NULL; /* (the request holds a reference: not reached) */
  pthread_mutex_unlock(&srv->mu);
  Py_DECREF(srv);
  PyObject_Free(self);
}

static PyMethodDef HttpCall_methods[] = {
    {"respond", (PyCFunction)HttpCall_respond, METH_VARARGS,
     "respond(status, fields, parts) -> bool: the whole answer (thread-safe); False if the "
     "request is over"},
    {"begin", (PyCFunction)HttpCall_begin, METH_VARARGS,
     "begin(status, fields) -> bool: start a chunked answer"},
    {"send", (PyCFunction)HttpCall_send, METH_O, "send(data) -> bool: one chunk"},
    {"end", (PyCFunction)HttpCall_end, METH_NOARGS, "end() -> bool: the last chunk"},
    {"abort", (PyCFunction)HttpCall_abort, METH_NOARGS,
     "abort(): close the request's connection now, whatever it still has to send"},
    {"writable", (PyCFunction)HttpCall_writable, METH_NOARGS,
     "writable() -> bool: the connection is open and its client reads its answers"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef HttpCall_getset[] = {
    {"open", (getter)HttpCall_get_open, NULL, "the request's connection is still open", NULL},
    {"on_gone", (getter)HttpCall_get_on_gone, (setter)HttpCall_set_on_gone,
     "a callable (or None) called once, with no arguments, on the server's IO thread if the "
     "request's client leaves (closes, resets or shuts its sending side) before its answer is "
     "complete: the work for it should stop. Called at once if it already left.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject HttpCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "embedtriton._h2.HttpCall",
    .tp_basicsize = sizeof(HttpCallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One HTTP/1.1 request of an HttpServer, answered through it from any thread.",
    .tp_dealloc = (destructor)HttpCall_dealloc,
    .tp_methods = HttpCall_methods,
    .tp_getset = HttpCall_getset,
};

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
                           NULL};
  const char *host, *libpath = NULL;
  int port, names = 0;
  PyObject *on_request, *on_refused, *tls = Py_None;
  Py_ssize_t max_conns = 1024, max_body = 64 << 20, max_hdr = 16384;
  double idle = 300.0, req = 30.0;
  if (self->started || self->on_request) {
    PyErr_SetString(PyExc_RuntimeError, "HttpServer.__init__ called twice");
    return -1;
  }
  if (!PyArg_ParseTupleAndKeywords(args, kw, "siOO|$nnnddOzp:HttpServer", kwlist, &host, &port,
                                   &on_request, &on_refused, &max_conns, &max_body, &max_hdr, &idle,
                                   &req, &tls, &libpath, &names))
    return -1;
  if (max_conns <= 0 || max_conns > INT_MAX || max_body <= 0 || max_hdr <= 0 ||
      max_hdr > INT32_MAX / 8 || !(idle > 0) || !(req > 0)) {
    PyErr_SetString(PyExc_ValueError, "HttpServer: limits must be positive");
    return -1;
  }
  self->max_conns = (int)max_conns;
  self->max_body = (size_t)max_body;
  self->max_hdr = (size_t)max_hdr;
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

#define H1_FAST_CAPSULE "embedtriton._native._HTTP_FAST"

/* set_fast(capsule, ctx) / set_fast(None, None): the C handler tried before on_request. */
static PyObject* HttpServer_set_fast(HttpServerObject* self, PyObject* args)
{
  PyObject *capsule, *ctx;
  if (!PyArg_ParseTuple(args, "OO:set_fast", &capsule, &ctx)) return NULL;
  H1Fast fast = NULL;
  if (capsule != Py_None) {
    fast = (H1Fast)PyCapsule_GetPointer(capsule, H1_FAST_CAPSULE);
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
      "{s:L,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:L,s:L,s:L}", "connections",
      (long long)STAT_GET(self->n_open), "accepted", (unsigned long long)STAT_GET(self->n_accepted),
      "refused", (unsigned long long)STAT_GET(self->n_refused), "emfile",
      (unsigned long long)STAT_GET(self->n_emfile), "evicted",
      (unsigned long long)STAT_GET(self->n_evicted), "idle_closed",
      (unsigned long long)STAT_GET(self->n_idle_closed), "requests",
      (unsigned long long)STAT_GET(self->n_requests), "request_timeouts",
      (unsigned long long)STAT_GET(self->n_timeouts), "paused",
      (unsigned long long)STAT_GET(self->n_paused), "paused_now",
      (long long)STAT_GET(self->g_paused), "held_bytes", (long long)STAT_GET(self->g_held),
      "buffered_bytes", (long long)STAT_GET(self->g_buffered));
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
     "for backpressure); gauges: paused_now (connections not read now), held_bytes (requests read, "
     "not yet handed over), buffered_bytes (answers not yet written)"},
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
        "names=False): HTTP/1.1 on one IO thread.",
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
