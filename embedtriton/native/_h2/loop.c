/* The IO thread's loop (io_main): epoll, reading, handing the recorded events
 * to Python with the GIL taken once per batch (dispatch), applying what send()
 * and finish() queued, timers, writing, and stopping. */
#include "h2.h"

#include <stdio.h>
#include <sys/epoll.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* dispatch to Python (IO thread, takes the GIL once per batch)              */

static CallObject* make_call(ServerObject* srv, Stream* st)
{
  CallObject* call = PyObject_GC_New(CallObject, &CallType);
  if (!call) return NULL;
  Py_INCREF(srv);
  call->srv = srv;
  call->st = NULL;
  call->user = Py_NewRef(Py_None);
  call->metadata = NULL;
  call->comp = ENC_IDENTITY;
  call->sent = 0;
  call->method = PyUnicode_DecodeLatin1(st->path, (Py_ssize_t)strlen(st->path), "replace");
  call->meta = st->meta;
  call->nmeta = st->nmeta;
  st->meta = NULL;
  st->nmeta = 0;
  memcpy(call->peer, st->peer, PEER_LEN);
  PyObject_GC_Track((PyObject*)call);
  if (!call->method) {
    Py_DECREF(call);
    return NULL;
  }
  pthread_mutex_lock(&srv->mu);
  call->st = st;
  pthread_mutex_unlock(&srv->mu);
  st->call = call;
  return call;
}

static void handler_failed(ServerObject* srv, PyObject* method, Stream* st)
{
  PyErr_WriteUnraisable(method);
  if (st->closed) return;
  const char* m = "the server's handler raised an exception";
  char* enc = percent_encode(m, strlen(m));
  int w = 0;
  pthread_mutex_lock(&srv->mu);
  finish_locked(srv, st, 13, enc, 0, &w);
  pthread_mutex_unlock(&srv->mu);
}

static void dispatch(ServerObject* srv)
{
  if (!srv->nev) return;
  pthread_mutex_lock(&srv->mu);
  srv->in_dispatch = 1;
  pthread_mutex_unlock(&srv->mu);
  PyEval_RestoreThread(srv->tstate);
  for (size_t i = 0; i < srv->nev; i++) {
    Event* e = &srv->ev[i];
    Stream* st = e->st;
    if (e->type == EV_CLOSE) {
      CallObject* call = st->call;
      int cancel;
      pthread_mutex_lock(&srv->mu);
      if (call) call->st = NULL;
      unlink_dirty_locked(srv, st);
      cancel = call && !st->finished_by_app;
      pthread_mutex_unlock(&srv->mu);
      if (cancel) {
        PyObject* args[1] = {(PyObject*)call};
        PyObject* r = PyObject_Vectorcall(srv->on_cancel, args, 1, NULL);
        if (r) Py_DECREF(r);
        else PyErr_WriteUnraisable(srv->on_cancel);
      }
      st->call = NULL;
      Py_XDECREF(call);
      stream_free(st);
      continue;
    }
    /* Reset, or its connection closed, before the application saw this: nobody is left to answer,
     * so no work is started (its EV_CLOSE follows, and cancels the call if an earlier event created
     * one). */
    if (st->closed || (st->conn && st->conn->dead)) {
      free(e->data);
      continue;
    }
    if (!st->call && !make_call(srv, st)) {
      PyErr_WriteUnraisable(NULL);
      free(e->data);
      continue;
    }
    PyObject* r;
    PyObject* method;
    if (e->type == EV_MSG) {
      PyObject* data = PyBytes_FromStringAndSize((const char*)e->data, (Py_ssize_t)e->len);
      free(e->data);
      method = srv->on_message;
      if (!data) {
        handler_failed(srv, method, st);
        continue;
      }
      PyObject* args[2] = {(PyObject*)st->call, data};
      r = PyObject_Vectorcall(method, args, 2, NULL);
      Py_DECREF(data);
    } else {
      method = srv->on_half_close;
      PyObject* args[1] = {(PyObject*)st->call};
      r = PyObject_Vectorcall(method, args, 1, NULL);
    }
    if (r) Py_DECREF(r);
    else handler_failed(srv, method, st);
  }
  srv->nev = 0;
  srv->tstate = PyEval_SaveThread();
}

/* Apply what send()/finish() queued: the number of streams (in srv->work). */
size_t h2_apply_dirty(ServerObject* srv)
{
  size_t n = 0;
  pthread_mutex_lock(&srv->mu);
  srv->in_dispatch = 0;
  srv->wake_pending = 0;
  for (Stream* st = srv->dirty_head; st; st = st->dnext) {
    if (n == srv->capwork) {
      srv->capwork = srv->capwork ? srv->capwork * 2 : 64;
      srv->work = xrealloc(srv->work, srv->capwork * sizeof *srv->work);
    }
    srv->work[n++] = st;
  }
  for (size_t i = 0; i < n; i++) {
    Stream* st = srv->work[i];
    st->dirty = 0;
    st->dprev = st->dnext = NULL;
    if (st->pq_head) {
      if (st->oq_tail) st->oq_tail->next = st->pq_head;
      else st->oq_head = st->pq_head;
      st->oq_tail = st->pq_tail;
      st->pq_head = st->pq_tail = NULL;
    }
    if (st->finish_req) st->fin_ready = 1;
    if (st->overflow) st->do_reset = 1;
  }
  srv->dirty_head = NULL;
  pthread_mutex_unlock(&srv->mu);

  for (size_t i = 0; i < n; i++) {
    Stream* st = srv->work[i];
    if (st->do_reset && !st->reset_sent) {
      /* Reset the stream (ENHANCE_YOUR_CALM: grpc clients report RESOURCE_EXHAUSTED) and drop what
       * it queued; the application gets on_cancel when the stream closes, its send() and finish()
       * already return False. */
      st->reset_sent = 1;
      free_outbufs(st->oq_head);
      st->oq_head = st->oq_tail = NULL;
      pthread_mutex_lock(&srv->mu);
      if (st->conn) st->conn->queued -= st->queued;
      st->queued = 0;
      pthread_mutex_unlock(&srv->mu);
      if (!st->closed && st->conn) {
        ng.submit_rst_stream(st->conn->sess, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_ENHANCE_YOUR_CALM);
        STAT_ADD(srv->n_buffer_resets, 1);
      }
      continue;
    }
    if (st->closed || !st->conn || st->trailers_sent || st->reset_sent) continue;
    nghttp2_session* sess = st->conn->sess;
    if (st->headers_sent) {
      ng.session_resume_data(sess, st->id);
    } else if (st->oq_head) {
      const char* enc = encoding_name(st->resp_enc); /* set by send() before it queued (under mu) */
      nghttp2_nv h[3] = {MAKE_NV(":status", "200", 3),
                         MAKE_NV("content-type", "application/grpc", 16),
                         MAKE_NV("grpc-encoding", enc, strlen(enc))};
      nghttp2_data_provider prd = {.source.ptr = st, .read_callback = data_read_cb};
      if (ng.submit_response(sess, st->id, h, st->resp_enc ? 3 : 2, &prd) == 0)
        st->headers_sent = 1;
    } else if (st->fin_ready) { /* Trailers-Only */
      char code[16];
      int cl = snprintf(code, sizeof code, "%d", st->fin_code);
      const char* m = st->fin_msg ? st->fin_msg : "";
      nghttp2_nv h[4] = {
          MAKE_NV(":status", "200", 3), MAKE_NV("content-type", "application/grpc", 16),
          MAKE_NV("grpc-status", code, (size_t)cl), MAKE_NV("grpc-message", m, strlen(m))};
      ng.submit_response(sess, st->id, h, m[0] ? 4 : 3, NULL);
      st->headers_sent = st->trailers_sent = 1;
    }
  }
  return n;
}

/* What send()/finish() queued, from a thread that is not the IO thread (a C answer, h2_reply.h):
 * written now when the IO thread waits in epoll_wait, as it would after the wake-up, which on a VM
 * is slow to come (tens of µs: its idle vCPU halts); the IO thread is woken all the same, to retire
 * the calls. When the IO thread is busy it writes the answer itself in its iteration. */
void write_or_wake(ServerObject* srv)
{
  if (pthread_mutex_trylock(&srv->io_mu) == 0) {
    if (srv->io_waiting) {
      STAT_ADD(srv->n_written_now, 1); /* (first: the client may read stats() once it has it) */
      size_t n = h2_apply_dirty(srv);
      for (size_t i = 0; i < n; i++)
        if (srv->work[i]->conn) conn_flush(srv->work[i]->conn);
      pthread_mutex_lock(&srv->mu);
      srv->wake_pending = 1; /* (the wake-up below) */
      pthread_mutex_unlock(&srv->mu);
    }
    pthread_mutex_unlock(&srv->io_mu);
  }
  wake(srv);
}

static void begin_stop(ServerObject* srv, double grace)
{
  srv->stopping = 1;
  srv->deadline = now_s() + (grace > 0 ? grace : 0);
  if (srv->listen_fd >= 0) {
    epoll_ctl(srv->epfd, EPOLL_CTL_DEL, srv->listen_fd, NULL);
    close(srv->listen_fd);
    srv->listen_fd = -1;
  }
  /* A shutdown notice (GOAWAY with the largest stream id): clients open no new streams here, and
   * none of those already on the wire is refused. Refusing some (a GOAWAY with the last processed
   * id) makes grpc clients retry them transparently, and grpcio 1.85 can then leave a streaming
   * call hanging past its deadline. Calls still open at the deadline are reset and the connection
   * closed. */
  for (Conn* c = srv->conns; c; c = c->next)
    if (!c->handshaking)
      ng.submit_goaway(c->sess, NGHTTP2_FLAG_NONE, 0x7fffffff, NGHTTP2_NO_ERROR, NULL, 0);
}

void* io_main(void* arg)
{
  ServerObject* srv = arg;
  PyGILState_STATE gs = PyGILState_Ensure();
  srv->tstate = PyEval_SaveThread();
  pthread_mutex_lock(&srv->io_mu);
  struct epoll_event evs[128];
  srv->now = now_s();
  srv->next_sweep = srv->now + srv->sweep_every;
  for (;;) {
    int timeout = -1;
    if (srv->nev || srv->pend) {
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
    srv->io_waiting = timeout != 0; /* (write_or_wake may write meanwhile) */
    if (timeout != 0) pthread_mutex_unlock(&srv->io_mu);
    int n = epoll_wait(srv->epfd, evs, 128, timeout);
    if (timeout != 0) pthread_mutex_lock(&srv->io_mu);
    srv->io_waiting = 0;
    if (n < 0) n = 0;
    srv->now = now_s();
    srv->iter++;
    for (int i = 0; i < n; i++) {
      void* p = evs[i].data.ptr;
      if (p == (void*)&srv->listen_fd) {
        if (srv->listen_fd >= 0) accept_some(srv);
      } else if (p == (void*)&srv->evfd) {
        uint64_t v;
        ssize_t r = read(srv->evfd, &v, sizeof v);
        (void)r;
      } else {
        Conn* c = p;
        /* The client shut its side or the connection failed: whatever it still has queued is not
         * read, as no answer could reach it (a request followed by a close must not start work). */
        if (evs[i].events & (EPOLLRDHUP | EPOLLERR | EPOLLHUP)) c->dead = 1;
        else if (evs[i].events & EPOLLIN) conn_readable(c);
        else if (c->handshaking && (evs[i].events & EPOLLOUT)) conn_readable(c);
      }
    }
    Conn* pnext;
    for (Conn* c = srv->pend; c;
         c = pnext) { /* left over from the last iteration and not read in this one */
      pnext = c->pnext;
      if (c->served != srv->iter) conn_readable(c);
    }
    dispatch(srv);
    h2_apply_dirty(srv);

    pthread_mutex_lock(&srv->mu);
    int stop_req = srv->stop_req;
    double grace = srv->grace;
    pthread_mutex_unlock(&srv->mu);
    if (stop_req && !srv->stopping) begin_stop(srv, grace);
    if (srv->now >= srv->next_sweep) sweep(srv);
    if (srv->stopping && !srv->hard && now_s() >= srv->deadline) {
      srv->hard = 1;
      for (Conn* c = srv->conns; c; c = c->next)
        if (!c->handshaking)
          for (Stream* st = c->streams; st; st = st->cnext)
            ng.submit_rst_stream(c->sess, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_CANCEL);
    }

    Conn* next;
    for (Conn* c = srv->conns; c; c = next) {
      next = c->next;
      conn_flush(c);
      int idle = c->outoff == c->outlen;
      if (c->dead || c->evicted ||
          (!c->handshaking && idle && !ng.session_want_read(c->sess) &&
           !ng.session_want_write(c->sess)) ||
          (srv->stopping && (srv->hard || c->handshaking || (idle && c->nstreams == 0))))
        conn_close(c);
    }
    if (srv->stopping && !srv->conns && !srv->nev) break;
  }
  pthread_mutex_unlock(&srv->io_mu);
  PyEval_RestoreThread(srv->tstate);
  /* Empty this thread's Python state while it is still the current one: PyGILState_Release
   * clears it after detaching, and some extensions' objects that a collection on this thread
   * left in its thread-locals crash when freed without a current thread state (gevent's hub,
   * created here when a tritonclient.http client was collected on this thread, segfaulted). */
  PyObject* locals = PyThreadState_GetDict();
  if (locals != NULL) PyDict_Clear(locals);
  PyErr_Clear();
  PyGILState_Release(gs);
  return NULL;
}
