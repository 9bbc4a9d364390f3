/* The Python type embedtriton._h2.Call: one gRPC call (an HTTP/2 stream), with
 * send() and finish() callable from any thread. */
#include "h2.h"

#include <stdio.h>
#include <structmember.h>

/* ------------------------------------------------------------------------ */
/* Call type                                                                 */

/* send() deflates a message this large or larger with the GIL released; a smaller one takes less
 * time than handing the GIL over and back could. */
#define DEFLATE_WITHOUT_GIL (64 * 1024)

/* A response message buffer with room for the gRPC prefix, which it writes: len bytes of payload
 * follow at data + 5. NULL when out of memory. */
static OutBuf* message_new(size_t len)
{
  OutBuf* ob = malloc(sizeof *ob + 5 + len);
  if (!ob) return NULL;
  ob->next = NULL;
  ob->len = 5 + len;
  ob->off = 0;
  ob->data[0] = 0;
  ob->data[1] = (uint8_t)(len >> 24);
  ob->data[2] = (uint8_t)(len >> 16);
  ob->data[3] = (uint8_t)(len >> 8);
  ob->data[4] = (uint8_t)len;
  return ob;
}

/* A response message over max_message_bytes: the call ends RESOURCE_EXHAUSTED (as grpc-core words
 * it); later finish() calls do nothing. */
static void refuse_large(CallObject* self, size_t len)
{
  ServerObject* srv = self->srv;
  char m[160];
  snprintf(m, sizeof m, "response message larger than max (%zu vs. %zu bytes)", len, srv->max_msg);
  char* enc = percent_encode(m, strlen(m));
  int w = 0;
  pthread_mutex_lock(&srv->mu);
  if (self->st) finish_locked(srv, self->st, 8, enc, 0, &w);
  else free(enc);
  pthread_mutex_unlock(&srv->mu);
  if (w) wake(srv);
}

/* Queue one message (prefixed, compressed with enc or not) on the call's stream; takes ob over.
 * Returns whether it was queued (not when the call is over or over its buffer limits). With
 * need_wake, the IO thread is not woken: *need_wake says whether it must be. */
static int queue_message(CallObject* self, OutBuf* ob, int enc, int* need_wake)
{
  ServerObject* srv = self->srv;
  int queued = 0, w = 0;
  pthread_mutex_lock(&srv->mu);
  Stream* st = self->st;
  if (st && st->conn && !st->finish_req) {
    Conn* c = st->conn;
    /* Bounded buffering: a client that does not read (a zero flow-control window) must not make the
     * server hold all the application sends. A message always fits when nothing else is queued (on
     * the stream, and on the connection); beyond max_buffered_bytes per connection, or half of it
     * per stream (so that one stalled stream leaves room for the others), the call fails: the IO
     * thread resets the stream and drops what it queued. Not counted: what nghttp2 and the
     * connection's write buffer hold, which does not grow with what the application sends (at most
     * one DATA frame of 1 MiB, and FLUSH_AT plus a frame). */
    if ((st->queued && st->queued + ob->len > srv->max_buf_stream) ||
        (c->queued && c->queued + ob->len > srv->max_buf)) {
      st->overflow = 1;
      st->finish_req = 1; /* finish() and later send()s return False; on_cancel follows the reset */
      w = mark_dirty_locked(srv, st);
    } else {
      if (st->pq_tail) st->pq_tail->next = ob;
      else st->pq_head = ob;
      st->pq_tail = ob;
      st->queued += ob->len;
      c->queued += ob->len;
      /* The response headers' grpc-encoding, whether or not this message was compressed; written
       * once (enc is fixed from the first send()), before the IO thread can see a queued message
       * and read it. */
      if (st->resp_enc != enc) st->resp_enc = enc;
      w = mark_dirty_locked(srv, st);
      queued = 1;
    }
  }
  pthread_mutex_unlock(&srv->mu);
  if (!queued) free(ob);
  if (need_wake) *need_wake |= w;
  else if (w) wake(srv);
  return queued;
}

/* finish(code, message) of a call: whether it was still open; -1 when out of memory. need_wake as
 * for queue_message. */
static int finish_call(CallObject* self, int code, const char* msg, size_t msglen, int* need_wake)
{
  ServerObject* srv = self->srv;
  char* enc = percent_encode(msg, msglen);
  if (!enc) return -1;
  int done = 0, w = 0;
  pthread_mutex_lock(&srv->mu);
  if (self->st) done = finish_locked(srv, self->st, code, enc, 1, &w);
  else free(enc);
  pthread_mutex_unlock(&srv->mu);
  if (need_wake) *need_wake |= w;
  else if (w) wake(srv);
  return done;
}

static PyObject* Call_send(CallObject* self, PyObject* arg)
{
  ServerObject* srv = self->srv;
  Py_buffer b;
  if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
  size_t len = (size_t)b.len;
  if (len > srv->max_msg || len > UINT32_MAX) {
    PyBuffer_Release(&b);
    refuse_large(self, len);
    Py_RETURN_FALSE;
  }
  int enc = self->comp;
  self->sent = 1;
  OutBuf* ob = NULL;
  if (enc != ENC_IDENTITY && len) {
    if (len >= DEFLATE_WITHOUT_GIL) {
      Py_BEGIN_ALLOW_THREADS
      ob = deflate_message(enc, b.buf, len);
      Py_END_ALLOW_THREADS
    } else {
      ob = deflate_message(enc, b.buf, len);
    }
  }
  if (!ob) { /* uncompressed: no compression asked for, or it did not make the message smaller */
    ob = message_new(len);
    if (!ob) {
      PyBuffer_Release(&b);
      return PyErr_NoMemory();
    }
    memcpy(ob->data + 5, b.buf, len);
  }
  PyBuffer_Release(&b);
  return PyBool_FromLong(queue_message(self, ob, enc, NULL));
}

/* ---- the C interface (h2_reply.h): a unary call answered without the GIL ---- */

static void* reply_message(size_t len, uint8_t** payload)
{
  OutBuf* ob = len <= UINT32_MAX ? message_new(len) : NULL;
  if (ob) *payload = ob->data + 5;
  return ob;
}

static void reply_discard(void* message)
{
  free(message);
}

static int reply(PyObject* call, void* message, int code, const char* text)
{
  CallObject* self = (CallObject*)call;
  OutBuf* ob = message;
  int w = 0;
  if (ob) {
    size_t len = ob->len - 5;
    if (len > self->srv->max_msg) {
      free(ob);
      refuse_large(self, len);
      return 0;
    }
    int enc = self->comp; /* (set_compression() came before the call was handed over) */
    if (enc != ENC_IDENTITY && len) {
      OutBuf* z = deflate_message(enc, ob->data + 5, len);
      if (z) {
        free(ob);
        ob = z;
      }
    }
    if (!queue_message(self, ob, enc, &w)) {
      if (w) write_or_wake(self->srv);
      return 0;
    }
  }
  int done = finish_call(self, code, text, strlen(text), &w) == 1;
  if (w) write_or_wake(self->srv); /* (this thread writes the answer if the IO thread sleeps) */
  return done;
}

const H2Reply h2_reply = {reply_message, reply,         reply_discard, &CallType,
                          h1_reply,      &HttpCallType, h1_on_gone};

static PyObject* Call_set_compression(CallObject* self, PyObject* arg)
{
  Py_ssize_t n;
  const char* name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8AndSize(arg, &n) : NULL;
  if (!name) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_TypeError, "set_compression() takes a str, not %.100s",
                   Py_TYPE(arg)->tp_name);
    return NULL;
  }
  int enc = encoding_of(name, (size_t)n);
  if (enc == ENC_UNKNOWN) {
    PyErr_Format(PyExc_ValueError, "compression must be 'identity', 'deflate' or 'gzip', not %R",
                 arg);
    return NULL;
  }
  if (self->sent &&
      enc != self->comp) { /* the response headers may already say another grpc-encoding */
    PyErr_SetString(PyExc_RuntimeError,
                    "set_compression() must come before the call's first send()");
    return NULL;
  }
  self->comp = enc;
  Py_RETURN_NONE;
}

static PyObject* Call_finish(CallObject* self, PyObject* args, PyObject* kw)
{
  static char* kwlist[] = {"code", "message", NULL};
  int code;
  const char* msg = "";
  Py_ssize_t msglen = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "i|s#:finish", kwlist, &code, &msg, &msglen))
    return NULL;
  int done = finish_call(self, code, msg, (size_t)msglen, NULL);
  if (done < 0) return PyErr_NoMemory();
  return PyBool_FromLong(done);
}

static PyObject* Call_get_metadata(CallObject* self, void* closure)
{
  (void)closure;
  if (!self->metadata) {
    PyObject* list = PyList_New((Py_ssize_t)self->nmeta);
    if (!list) return NULL;
    for (size_t i = 0; i < self->nmeta; i++) {
      const char *k = self->meta[2 * i], *v = self->meta[2 * i + 1];
      PyObject* t = Py_BuildValue("(NN)", PyUnicode_DecodeLatin1(k, (Py_ssize_t)strlen(k), NULL),
                                  PyUnicode_DecodeLatin1(v, (Py_ssize_t)strlen(v), NULL));
      if (!t) {
        Py_DECREF(list);
        return NULL;
      }
      PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    self->metadata = list;
  }
  return Py_NewRef(self->metadata);
}

static PyObject* Call_get_peer(CallObject* self, void* closure)
{
  (void)closure;
  return PyUnicode_FromString(self->peer);
}

static PyObject* Call_get_user(CallObject* self, void* closure)
{
  (void)closure;
  return Py_NewRef(self->user);
}

static int Call_set_user(CallObject* self, PyObject* v, void* closure)
{
  (void)closure;
  Py_XSETREF(self->user, Py_NewRef(v ? v : Py_None));
  return 0;
}

static int Call_traverse(CallObject* self, visitproc visit, void* arg)
{
  Py_VISIT(self->user);
  Py_VISIT(self->srv);
  return 0;
}

static int Call_clear(CallObject* self)
{
  Py_CLEAR(self->user);
  return 0;
}

static void Call_dealloc(CallObject* self)
{
  PyObject_GC_UnTrack(self);
  /* self->st is NULL here: a live stream holds a reference to its call */
  Py_CLEAR(self->user);
  Py_CLEAR(self->method);
  Py_CLEAR(self->metadata);
  free_meta(self->meta, self->nmeta);
  Py_CLEAR(self->srv);
  PyObject_GC_Del(self);
}

static PyMethodDef Call_methods[] = {
    {"send", (PyCFunction)Call_send, METH_O,
     "send(data) -> bool: queue one response message (thread-safe); False if the call is over"},
    {"set_compression", (PyCFunction)Call_set_compression, METH_O,
     "set_compression(algorithm): compress the response messages ('identity', 'deflate' or "
     "'gzip'); before the first "
     "send()"},
    {"finish", (PyCFunction)(void (*)(void))Call_finish, METH_VARARGS | METH_KEYWORDS,
     "finish(code, message='') -> bool: end the call with a gRPC status (thread-safe); False if "
     "already over"},
    {NULL, NULL, 0, NULL}};

static PyMemberDef Call_members[] = {
    {"method", T_OBJECT_EX, offsetof(CallObject, method), READONLY, "the :path"},
    {NULL, 0, 0, 0, NULL}};

static PyGetSetDef Call_getset[] = {
    {"metadata", (getter)Call_get_metadata, NULL, "request headers other than pseudo-headers",
     NULL},
    {"peer", (getter)Call_get_peer, NULL, "the client's address", NULL},
    {"user", (getter)Call_get_user, (setter)Call_set_user,
     "free slot for the handler's per-call state", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject CallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "embedtriton._h2.Call",
    .tp_basicsize = sizeof(CallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One gRPC call (an HTTP/2 stream).",
    .tp_dealloc = (destructor)Call_dealloc,
    .tp_traverse = (traverseproc)Call_traverse,
    .tp_clear = (inquiry)Call_clear,
    .tp_methods = Call_methods,
    .tp_members = Call_members,
    .tp_getset = Call_getset,
};
