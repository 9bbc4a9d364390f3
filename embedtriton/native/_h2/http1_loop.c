/* The HTTP/1.1 IO thread (h1_main): epoll, reading and parsing, handing requests to Python with
 * the GIL taken once per batch (dispatch), writing what the answers queued, timers, stopping. */
#include "http1.h"

#include <ctype.h>
#include <stdio.h>
#include <strings.h>
#include <sys/epoll.h>
#include <unistd.h>

void h1_wake(HttpServerObject* srv)
{
  uint64_t one = 1;
  ssize_t r = write(srv->evfd, &one, sizeof one);
  (void)r;
}

/* Put c on the dirty list; 1 if the caller must wake the IO thread. Holds mu. */
int h1_mark_dirty_locked(HttpServerObject* srv, HConn* c)
{
  if (!c->dirty) {
    c->dirty = 1;
    c->dnext = srv->dirty_head;
    srv->dirty_head = c;
  }
  if (srv->in_dispatch || srv->wake_pending) return 0;
  srv->wake_pending = 1;
  return 1;
}

/* ------------------------------------------------------------------------ */
/* dispatch to Python                                                        */

static PyObject* latin1(const uint8_t* p, size_t n)
{
  return PyUnicode_DecodeLatin1((const char*)p, (Py_ssize_t)n, NULL);
}

/* on_request's arguments: the call, method, url, headers (lower-cased names: the first value),
 * body, and the fields with their names as sent (or None) */
static PyObject* request_args(HttpServerObject* srv, HReq* r)
{
  const uint8_t* b = r->blob;
  Head* h = &r->head;
  PyObject *method = latin1(b + h->method.off, h->method.len),
           *url = latin1(b + h->url.off, h->url.len);
  PyObject* headers = PyDict_New();
  PyObject* names = srv->names ? PyList_New(0) : Py_NewRef(Py_None);
  PyObject* body = PyBytes_FromStringAndSize((const char*)b + r->head_len, (Py_ssize_t)r->body_len);
  if (!method || !url || !headers || !names || !body) goto fail;
  char lower[256];
  for (size_t i = 0; i + 1 < h->nfields; i += 2) {
    Span n = h->fields[i], v = h->fields[i + 1];
    PyObject* value = PyBytes_FromStringAndSize((const char*)b + v.off, v.len);
    PyObject* key = NULL;
    if (!value) goto fail;
    if (n.len <= sizeof lower) {
      for (uint32_t k = 0; k < n.len; k++) lower[k] = (char)tolower(b[n.off + k]);
      key = PyBytes_FromStringAndSize(lower, n.len);
    } else {
      key = PyBytes_FromStringAndSize((const char*)b + n.off, n.len);
      if (key) {
        char* s = PyBytes_AS_STRING(key);
        for (uint32_t k = 0; k < n.len; k++) s[k] = (char)tolower((unsigned char)s[k]);
      }
    }
    PyObject* got = key ? PyDict_SetDefault(headers, key, value) : NULL;
    if (got && names != Py_None) {
      PyObject* pair = Py_BuildValue("(NO)", latin1(b + n.off, n.len), value);
      if (!pair || PyList_Append(names, pair) < 0) got = NULL;
      Py_XDECREF(pair);
    }
    Py_XDECREF(key);
    Py_DECREF(value);
    if (!got) goto fail;
  }
  return Py_BuildValue("(ONNNNN)", r->call, method, url, headers, body, names);
fail:
  Py_XDECREF(method);
  Py_XDECREF(url);
  Py_XDECREF(headers);
  Py_XDECREF(names);
  Py_XDECREF(body);
  return NULL;
}

static int span_is(const uint8_t* b, Span s, const char* text)
{
  size_t n = strlen(text);
  if (s.len != n) return 0;
  for (size_t i = 0; i < n; i++)
    if (tolower(b[s.off + i]) != text[i]) return 0;
  return 1;
}

/* Whether a header value names gzip or deflate (any case): an answer the client accepts
 * compressed, which the Python path writes. */
static int names_compression(const uint8_t* p, size_t n)
{
  for (size_t i = 0; i + 4 <= n; i++) {
    if (i + 4 <= n && strncasecmp((const char*)p + i, "gzip", 4) == 0) return 1;
    if (i + 7 <= n && strncasecmp((const char*)p + i, "deflate", 7) == 0) return 1;
  }
  return 0;
}

/* The request to srv->fast's prepare(), if it may take it (a POST to /v2/models/ with no
 * Content-Encoding, no compressed answer accepted, a numeric Inference-Header-Content-Length if
 * any): its state for submit(), or NULL when declined. */
static void* try_fast(HttpServerObject* srv, HReq* r)
{
  const uint8_t* b = r->blob;
  Head* h = &r->head;
  static const char prefix[] = "/v2/models/";
  if (!span_is(b, h->method, "post") || h->url.len < sizeof prefix - 1 ||
      memcmp(b + h->url.off, prefix, sizeof prefix - 1) != 0)
    return NULL;
  long long header_len = -1;
  int seen_accept = 0, seen_length = 0;
  for (size_t i = 0; i + 1 < h->nfields; i += 2) {
    Span n = h->fields[i], v = h->fields[i + 1];
    if (span_is(b, n, "content-encoding")) return NULL;
    if (span_is(b, n, "accept-encoding") && !seen_accept++) {
      if (names_compression(b + v.off, v.len)) return NULL;
    } else if (span_is(b, n, "inference-header-content-length") && !seen_length++) {
      if (v.len == 0 || v.len > 18) return NULL;
      header_len = 0;
      for (uint32_t k = 0; k < v.len; k++) {
        uint8_t d = b[v.off + k];
        if (d < '0' || d > '9') return NULL;
        header_len = header_len * 10 + (d - '0');
      }
    }
  }
  return srv->fast->prepare((PyObject*)r->call, (const char*)b + h->url.off, h->url.len,
                            b + r->head_len, r->body_len, header_len, srv->fast_ctx);
}

static HttpCallObject* make_call(HttpServerObject* srv, HReq* r)
{
  HttpCallObject* call = PyObject_New(HttpCallObject, &HttpCallType);
  if (!call) return NULL;
  call->srv = (HttpServerObject*)Py_NewRef(srv);
  call->streaming = 0;
  call->keep_alive = r->keep_alive && !r->refused;
  call->lost = 0;
  call->on_gone = NULL;
  pthread_mutex_lock(&srv->mu);
  call->req = r;
  pthread_mutex_unlock(&srv->mu);
  r->call = call;
  return call;
}

/* A handler that raised, or whose arguments could not be made: 500, if nothing was answered. */
static void fallback(HttpServerObject* srv, HReq* r)
{
  static const char body[] = "{\"error\": \"internal error: the request's handler failed\"}";
  char head[160];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   sizeof body - 1);
  OutBuf* ob = malloc(sizeof *ob + (size_t)n + sizeof body);
  if (!ob) return;
  ob->next = NULL;
  ob->off = 0;
  ob->len = (size_t)n + sizeof body - 1;
  memcpy(ob->data, head, (size_t)n);
  memcpy(ob->data + n, body, sizeof body - 1);
  int w = 0;
  pthread_mutex_lock(&srv->mu);
  if (r->conn && !r->answered) {
    r->answered = r->done = 1;
    r->keep_alive = 0;
    r->qh = r->qt = ob;
    r->conn->buffered += ob->len;
    STAT_ADD(srv->g_buffered, (int64_t)ob->len);
    w = h1_mark_dirty_locked(srv, r->conn);
    ob = NULL;
  }
  pthread_mutex_unlock(&srv->mu);
  free(ob);
  if (w) h1_wake(srv);
}

/* The references h1_reply handed back (mu held): taken, to release with the GIL. */
static HttpCallObject** take_gone_locked(HttpServerObject* srv, size_t* n)
{
  HttpCallObject** gone = srv->gone;
  *n = srv->ngone;
  if (*n == 0) return NULL;
  srv->gone = NULL;
  srv->ngone = srv->capgone = 0;
  return gone;
}

static void release_gone(HttpCallObject** gone, size_t n)
{
  for (size_t i = 0; i < n; i++) Py_DECREF(gone[i]);
  free(gone);
}

/* The calls whose clients left before their answers (h1_lost_locked): each one's on_gone, once. */
static void call_lost(HttpServerObject* srv)
{
  for (size_t i = 0; i < srv->nlost; i++) {
    HttpCallObject* call = srv->lost[i];
    PyObject* fn = call->on_gone;
    call->on_gone = NULL;
    if (fn == NULL) continue;
    PyObject* res = PyObject_CallNoArgs(fn);
    if (res) Py_DECREF(res);
    else PyErr_WriteUnraisable(fn);
    Py_DECREF(fn);
  }
  srv->nlost = 0;
}

/* With the GIL: hand r to on_request (or on_refused). */
static void to_python(HttpServerObject* srv, HReq* r)
{
  PyObject *fn, *args;
  if (r->refused) {
    fn = srv->on_refused;
    args = Py_BuildValue("(OisN)", r->call, r->refused, r->refusal ? r->refusal : "",
                         PyBytes_FromStringAndSize((const char*)r->blob, (Py_ssize_t)r->head_len));
  } else {
    fn = srv->on_request;
    args = request_args(srv, r);
  }
  free(r->blob);
  r->blob = NULL;
  PyObject* res = args ? PyObject_Call(fn, args, NULL) : NULL;
  Py_XDECREF(args);
  if (res) Py_DECREF(res);
  else {
    PyErr_WriteUnraisable(fn);
    fallback(srv, r);
  }
}

static void dispatch(HttpServerObject* srv)
{
  size_t ngone;
  pthread_mutex_lock(&srv->mu);
  HttpCallObject** gone = take_gone_locked(srv, &ngone);
  srv->in_dispatch = srv->ntodo || srv->ndone || srv->nlost || ngone;
  pthread_mutex_unlock(&srv->mu);
  srv->gone_waiting = 0;
  if (!srv->in_dispatch) return;
  PyEval_RestoreThread(srv->tstate);
  call_lost(srv); /* (before done's references go: some of them hold these calls) */
  release_gone(gone, ngone);
  for (size_t i = 0; i < srv->ndone; i++) { /* (on_gone may hold what holds the call: a cycle) */
    Py_CLEAR(srv->done[i]->on_gone);
    Py_DECREF(srv->done[i]);
  }
  srv->ndone = 0;
  /* Requests the fast handler prepared (with the GIL) are submitted after the loop, without it:
   * the model thread runs meanwhile (an execute begins by taking the GIL). */
  const H1FastOps* fast = srv->fast;
  size_t nprepared = 0;
  for (size_t i = 0; i < srv->ntodo; i++) {
    HReq* r = srv->todo[i];
    HConn* c = r ? r->conn : NULL;
    if (!c || c->dead) continue; /* nobody is left to answer */
    c->held -= r->head_len + r->body_len;
    STAT_ADD(srv->g_held, -(int64_t)(r->head_len + r->body_len));
    if (!make_call(srv, r)) {
      PyErr_WriteUnraisable(NULL);
      fallback(srv, r);
      continue;
    }
    if (!r->refused && fast != NULL && (r->prepared = try_fast(srv, r)) != NULL) {
      srv->todo[nprepared++] = r; /* (i >= nprepared: the list is compacted as it is read) */
      continue;
    }
    to_python(srv, r);
  }
  srv->ntodo = 0;
  srv->tstate = PyEval_SaveThread();
  size_t ndeclined = 0;
  for (size_t i = 0; i < nprepared; i++) {
    HReq* r = srv->todo[i];
    if (fast->submit(r->prepared)) {
      r->prepared = NULL;
      free(r->blob);
      r->blob = NULL;
    } else {
      srv->todo[ndeclined++] = r;
    }
  }
  if (ndeclined == 0) return;
  PyEval_RestoreThread(srv->tstate); /* (rare: a request the C path does not take after all) */
  for (size_t i = 0; i < ndeclined; i++) {
    HReq* r = srv->todo[i];
    fast->abandon(r->prepared);
    r->prepared = NULL;
    to_python(srv, r);
  }
  srv->tstate = PyEval_SaveThread();
}

/* Write what respond()/send() queued since. */
static void apply_dirty(HttpServerObject* srv)
{
  size_t n = 0;
  pthread_mutex_lock(&srv->mu);
  srv->in_dispatch = 0;
  srv->wake_pending = 0;
  srv->gone_waiting = srv->ngone > 0; /* (handed back since dispatch: no wake-up came for them) */
  for (HConn* c = srv->dirty_head; c; c = c->dnext) {
    if (n == srv->capwork) {
      srv->capwork = srv->capwork ? srv->capwork * 2 : 64;
      srv->work = xrealloc(srv->work, srv->capwork * sizeof *srv->work);
    }
    srv->work[n++] = c;
    c->dirty = 0;
  }
  srv->dirty_head = NULL;
  pthread_mutex_unlock(&srv->mu);
  for (size_t i = 0; i < n; i++) h1_flush(srv->work[i]);
}

static void begin_stop(HttpServerObject* srv, double grace)
{
  srv->stopping = 1;
  srv->deadline = now_s() + (grace > 0 ? grace : 0);
  if (srv->listen_fd >= 0) {
    epoll_ctl(srv->epfd, EPOLL_CTL_DEL, srv->listen_fd, NULL);
    close(srv->listen_fd);
    srv->listen_fd = -1;
  }
}

void* h1_main(void* arg)
{
  HttpServerObject* srv = arg;
  PyGILState_STATE gs = PyGILState_Ensure();
  srv->tstate = PyEval_SaveThread();
  struct epoll_event evs[128];
  srv->now = now_s();
  srv->next_sweep = srv->now + srv->sweep_every;
  for (;;) {
    int timeout = -1;
    if (srv->ntodo || srv->ndone || srv->nlost || srv->pend || srv->gone_waiting) {
      timeout = 0;
    } else {
      double wake_at = srv->conns || srv->accept_at > 0 ? srv->next_sweep : -1;
      if (srv->stopping) {
        double at = srv->deadline < srv->now + 0.05 ? srv->deadline : srv->now + 0.05;
        if (wake_at < 0 || at < wake_at) wake_at = at;
      }
      if (wake_at >= 0) {
        double left = wake_at - now_s();
        timeout = left <= 0 ? 0 : (int)(left * 1000) + 1;
      }
    }
    int n = epoll_wait(srv->epfd, evs, 128, timeout);
    if (n < 0) n = 0;
    srv->now = now_s();
    srv->iter++;
    for (int i = 0; i < n; i++) {
      void* p = evs[i].data.ptr;
      uint32_t e = evs[i].events;
      if (p == (void*)&srv->listen_fd) {
        if (srv->listen_fd >= 0) h1_accept(srv);
      } else if (p == (void*)&srv->evfd) {
        uint64_t v;
        ssize_t r = read(srv->evfd, &v, sizeof v);
        (void)r;
      } else {
        HConn* c = p;
        if (c->dead) continue;
        if (e & (EPOLLIN | EPOLLRDHUP)) h1_readable(c);
        if (e & (EPOLLERR | EPOLLHUP)) c->dead = 1; /* the client is gone: no answer can reach it */
        else if (c->handshaking && (e & EPOLLOUT)) h1_readable(c);
        else if (e & EPOLLOUT) h1_flush(c);
        if (c->eof) h1_flush(c); /* closes it once its answers are out */
      }
    }
    HConn* pnext;
    for (HConn* c = srv->pend; c; c = pnext) { /* left over from the last iteration */
      pnext = c->pnext;
      if (c->served != srv->iter) h1_readable(c);
    }
    dispatch(srv);
    apply_dirty(srv);

    pthread_mutex_lock(&srv->mu);
    int stop_req = srv->stop_req;
    double grace = srv->grace;
    pthread_mutex_unlock(&srv->mu);
    if (stop_req && !srv->stopping) begin_stop(srv, grace);
    if (srv->now >= srv->next_sweep) h1_sweep(srv);
    if (srv->stopping && !srv->hard && now_s() >= srv->deadline) srv->hard = 1;

    HConn* next;
    for (HConn* c = srv->conns; c; c = next) {
      next = c->next;
      if (c->dead || (srv->stopping && (srv->hard || c->handshaking || h1_idle(c)))) {
        pthread_mutex_lock(&srv->mu);
        int writing = c->writer; /* (h1_reply's direct write: closed once it is done) */
        c->writer = 1;           /* (closing: nobody else writes to it from here on) */
        pthread_mutex_unlock(&srv->mu);
        if (!writing) h1_close(c);
      }
    }
    if (srv->stopping && !srv->conns) {
      srv->ntodo = 0; /* (their connections are gone) */
      if (!srv->ndone && !srv->nlost) break;
    }
  }
  PyEval_RestoreThread(srv->tstate);
  size_t ngone;
  pthread_mutex_lock(&srv->mu);
  srv->io_done = 1; /* (h1_reply releases what comes later itself) */
  HttpCallObject** gone = take_gone_locked(srv, &ngone);
  pthread_mutex_unlock(&srv->mu);
  release_gone(gone, ngone);
  PyObject* locals = PyThreadState_GetDict(); /* as _h2's io_main: emptied while current */
  if (locals != NULL) PyDict_Clear(locals);
  PyErr_Clear();
  PyGILState_Release(gs);
  return NULL;
}
