/* The Python type embedtriton._h2.HttpCall: one request of an HttpServer, answered from any
 * thread (respond(), or begin() / send() / end() for a chunked stream), h2_reply.h's http_reply
 * for C, and on_gone, the hook called if its client leaves before the answer. */
#include "http1.h"

#include <errno.h>
#include <stdio.h>
#include <sys/socket.h>

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

/* A whole answer written on this thread (h1_reply, no GIL), when it is the connection's next one
 * and nothing else is being written to it (plain TCP): the client reads it without waiting for the
 * IO thread to wake, which then retires the request. 1 when it took ob (what the socket did not
 * take is queued for the IO thread); 0 when the IO thread must write it (enqueue). */
static int write_now(HttpCallObject* self, OutBuf* ob)
{
  HttpServerObject* srv = self->srv;
  pthread_mutex_lock(&srv->mu);
  HReq* r = self->req;
  HConn* c = r != NULL ? r->conn : NULL;
  /* (c->qhead and c->wh change only while c->writer is set, or, for qhead, while it is NULL) */
  if (c == NULL || c->ssl != NULL || c->writer || c->aborted || c->wh != NULL || c->qhead != r ||
      r->answered) {
    pthread_mutex_unlock(&srv->mu);
    return 0;
  }
  c->writer = 1;
  r->answered = r->done = 1;
  pthread_mutex_unlock(&srv->mu);
  STAT_ADD(srv->n_written_now, 1); /* (first: the client may read stats() once it has it) */
  ssize_t w;
  do w = send(c->fd, ob->data, ob->len, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (w < 0 && errno == EINTR);
  int failed = w < 0 && errno != EAGAIN && errno != EWOULDBLOCK;
  size_t sent = w > 0 ? (size_t)w : 0;
  pthread_mutex_lock(&srv->mu);
  if (failed) {
    c->aborted = 1; /* (the IO thread closes it) */
  } else if (sent < ob->len) {
    ob->off = sent;
    c->wh = c->wt = ob;
    c->buffered += ob->len - sent;
    STAT_ADD(srv->g_buffered, (int64_t)(ob->len - sent));
    ob = NULL;
  }
  c->writer = 0;
  int wake = h1_mark_dirty_locked(srv, c);
  pthread_mutex_unlock(&srv->mu);
  free(ob);
  if (wake) h1_wake(srv);
  return 1;
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
  int open = write_now(self, ob) || enqueue(self, ob, 0, 1);
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
