/* Streams: a call with several responses (decoupled and iterative models),
 * queued for the consumer that pops them (stream_next) until it closes the
 * stream or the final response arrives. A stream's stage hooks (stream_ops:
 * Triton's responses, its end, its release, its cancel, its free) live here;
 * complete.c picks them for a call submitted with stream=True. The consumer
 * blocks (stream_next), or is woken by its event loop or called here (its
 * target) when a response arrives. */
#include "streams.h"

#include "calls.h"
#include "cancel.h"
#include "graveyard.h"
#include "outputs.h"
#include "threads.h"

#include <errno.h>

/* Wake an asyncio consumer's loop (loop.call_soon_threadsafe(wake)) or call the
 * consumer's target (wake()) here, on the thread that completes the call (loop and
 * target live until the call is freed). */
static void wake_stream_consumer(Call* c)
{
  int entered = gil_enter();
  PyObject* wake = Py_NewRef(c->to.wake);
  if (c->loop != NULL) {
    PyObject* r = PyObject_CallMethodObjArgs(c->loop, s_call_soon_threadsafe, wake, NULL);
    if (r == NULL) PyErr_Clear(); /* the loop is closed */
    Py_XDECREF(r);
  } else {
    PyObject* r = PyObject_CallNoArgs(wake);
    if (r == NULL) PyErr_WriteUnraisable(wake);
    Py_XDECREF(r);
  }
  Py_DECREF(wake);
  gil_leave(entered);
}

__thread int t_hold_back = 0;

/* The bytes of a response's outputs (what it holds in the queue). */
static uint64_t response_bytes(TRITONSERVER_InferenceResponse* response)
{
  uint32_t n = 0;
  uint64_t total = 0;
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceResponseOutputCount(response, &n);
  if (err) return api.TRITONSERVER_ErrorDelete(err), 0;
  for (uint32_t i = 0; i < n; i++) {
    const char* name;
    TRITONSERVER_DataType dtype;
    const int64_t* shape;
    uint64_t ndim, size = 0;
    const void* base;
    TRITONSERVER_MemoryType mtype;
    int64_t mtype_id;
    void* userp;
    err = api.TRITONSERVER_InferenceResponseOutput(response, i, &name, &dtype, &shape, &ndim, &base,
                                                   &size, &mtype, &mtype_id, &userp);
    if (err) api.TRITONSERVER_ErrorDelete(err);
    else total += size;
  }
  return total;
}

static int over(StreamCall* s, size_t responses, uint64_t bytes)
{
  return s->queued > responses || s->bytes > bytes;
}

/* On a t_hold_back thread, after queueing: while the consumer is behind, wait (without the GIL)
 * until it has taken the queue down to half, let go, or the stream ended. A consumer that never
 * reads holds the model back as a generator would be; stop() ends the stream (stream_wake). */
static void hold_back(StreamCall* s)
{
  pthread_mutex_lock(&s->mu);
  if (!over(s, STREAM_HOLD_RESPONSES, STREAM_HOLD_BYTES)) {
    pthread_mutex_unlock(&s->mu);
    return;
  }
  pthread_mutex_unlock(&s->mu);
  PyThreadState* saved = PyGILState_Check() ? PyEval_SaveThread() : NULL;
  pthread_mutex_lock(&s->mu);
  while (!s->closed && !s->finished && !s->c.aborted &&
         over(s, STREAM_HOLD_RESPONSES / 2, STREAM_HOLD_BYTES / 2)) {
    s->held = 1;
    pthread_cond_wait(&s->room, &s->mu);
  }
  s->held = 0;
  pthread_mutex_unlock(&s->mu);
  if (saved) PyEval_RestoreThread(saved);
}

/* Under mu: the consumer took responses, let go, or the stream ended: a held producer may go on. */
static void make_room(StreamCall* s)
{
  if (s->held &&
      (s->closed || s->finished || !over(s, STREAM_HOLD_RESPONSES / 2, STREAM_HOLD_BYTES / 2)))
    pthread_cond_broadcast(&s->room);
}

/* Triton's response callback for a stream: queue the response for the consumer. */
static void stream_response(Call* c, TRITONSERVER_InferenceResponse* response, uint32_t flags)
{
  StreamCall* s = (StreamCall*)c;
  Queued* q = response ? malloc(sizeof(Queued)) : NULL;
  if (q) /* (its bytes count only on a thread that holds back: elsewhere the bound never applies) */
    q->next = NULL, q->response = response, q->bytes = t_hold_back ? response_bytes(response) : 0;
  int final = (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) != 0;
  pthread_mutex_lock(&s->mu);
  int notify = !s->closed && !c->aborted && c->to.wake != NULL;
  if (q && !s->closed && !c->aborted) {
    if (s->tail) s->tail->next = q;
    else s->head = q;
    s->tail = q;
    s->queued++;
    s->bytes += q->bytes;
    q = NULL;
  }
  if (final) {
    c->finalized = 1;
    if (call_claim(c)) s->finished = 1;
  }
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (q) { /* nobody reads it any more */
    bury(NULL, q->response);
    free(q);
  }
  if (notify) wake_stream_consumer(c);
  if (final) call_unref(c);           /* Triton's final response */
  else if (t_hold_back) hold_back(s); /* (the consumer was woken first: it may take the queue) */
}

/* With the GIL: the stream was completed here, not by Triton (claimed): it ends. */
static void stream_wake(Call* c)
{
  StreamCall* s = (StreamCall*)c;
  pthread_mutex_lock(&s->mu);
  s->finished = 1;
  pthread_cond_signal(&s->cv);
  make_room(s);
  int notify = !s->closed && c->to.wake != NULL;
  pthread_mutex_unlock(&s->mu);
  if (notify) wake_stream_consumer(c);
}

/* With the GIL: Triton released the stream's request. */
static void stream_released(Call* c, TRITONSERVER_InferenceRequest* request)
{
  (void)c;
  take_stream_closed(request); /* forget it (closed, or cancelled): the pointer may be reused */
  if (g_request_done != NULL) {
    /* an iterative model's generator for it, if any, is done too (Triton may have
     * dropped a cancelled request without running the model again) */
    PyObject* r = PyObject_CallFunction(g_request_done, "N", PyLong_FromVoidPtr(request));
    if (r == NULL) PyErr_WriteUnraisable(g_request_done);
    Py_XDECREF(r);
  }
}

static void mark_stream_closed(void* request);

/* Under held_lock, as Triton's cancellation flag is set: list the request as closed. */
static void stream_cancelled(Call* c)
{
  mark_stream_closed(c->request);
}

/* With the GIL: the call is freed; so is what its consumer never read. */
static void stream_destroy(Call* c)
{
  StreamCall* s = (StreamCall*)c;
  for (Queued* q = s->head; q != NULL;) {
    Queued* next = q->next;
    bury(NULL, q->response);
    free(q);
    q = next;
  }
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  pthread_cond_destroy(&s->room);
}

/* A new stream's queue (its call allocated as a StreamCall). */
void stream_init(Call* c)
{
  StreamCall* s = (StreamCall*)c;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_cond_init(&s->room, NULL);
}

const CallOps stream_ops = {
    .response = stream_response,
    .finish = NULL, /* (stream_response ends the stream itself) */
    .wake = stream_wake,
    .released = stream_released,
    .cancelled = stream_cancelled,
    .destroy = stream_destroy,
};

/* stream_next(stream, block) -> (0, outputs) | (1, None) when nothing is
 * there yet (block=False) | (2, None) at the end. An error response raises. */
PyObject* py_stream_next(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
  (void)self;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "stream_next() takes 2 arguments");
    return NULL;
  }
  Call* c = (Call*)PyCapsule_GetPointer(args[0], "embedtriton.stream");
  if (c == NULL) return NULL;
  StreamCall* s = (StreamCall*)c;
  int block = PyObject_IsTrue(args[1]) == 1;
  Queued* q = NULL;
  int finished = 0;
  int main = block && on_main_thread();
  PyThreadState* saved = block ? PyEval_SaveThread() : NULL; /* never wait for the GIL holding mu */
  pthread_mutex_lock(&s->mu);
  while (block && s->head == NULL && !s->finished) {
    if (!main) {
      pthread_cond_wait(&s->cv, &s->mu);
      continue;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)SIGNAL_CHECK_NS;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    if (pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT) { /* run signal handlers */
      pthread_mutex_unlock(&s->mu);
      PyEval_RestoreThread(saved);
      if (PyErr_CheckSignals() < 0) return NULL; /* Ctrl-C: the iterator closes the stream */
      saved = PyEval_SaveThread();
      pthread_mutex_lock(&s->mu);
    }
  }
  q = s->head;
  if (q != NULL) {
    s->head = q->next;
    if (s->head == NULL) s->tail = NULL;
    s->queued--;
    s->bytes -= q->bytes;
    make_room(s);
  }
  finished = s->finished;
  pthread_mutex_unlock(&s->mu);
  if (saved) PyEval_RestoreThread(saved);
  if (q == NULL) {
    if (finished && c->aborted)
      return raise_triton(TRITONSERVER_ERROR_UNAVAILABLE,
                          "the server stopped before this stream completed");
    if (finished && c->gate_error != NULL) return raise_from(c->gate_error, 0);
    return Py_BuildValue("(iO)", finished ? 2 : 1, Py_None);
  }
  PyObject* outputs = collect_response(q->response, c);
  bury(NULL, q->response);
  free(q);
  if (outputs == NULL) return NULL;
  PyObject* r = Py_BuildValue("(iN)", 0, outputs);
  return r;
}

/* Streams whose consumer left while Triton still held the request. Triton's
 * cancellation flag does not reliably survive a RESCHEDULE release, so the
 * iterative path also checks this list (keyed by the request pointer). */
static pthread_mutex_t closed_lock = PTHREAD_MUTEX_INITIALIZER;
static void** closed_requests = NULL;
static size_t closed_len = 0, closed_cap = 0;

static void mark_stream_closed(void* request)
{
  pthread_mutex_lock(&closed_lock);
  if (closed_len == closed_cap) {
    size_t cap = closed_cap ? 2 * closed_cap : 16;
    void** grown = realloc(closed_requests, cap * sizeof(void*));
    if (grown) closed_requests = grown, closed_cap = cap;
  }
  if (closed_len < closed_cap) closed_requests[closed_len++] = request;
  pthread_mutex_unlock(&closed_lock);
}

int take_stream_closed(void* request)
{
  int found = 0;
  pthread_mutex_lock(&closed_lock);
  for (size_t i = 0; i < closed_len; i++)
    if (closed_requests[i] == request) {
      closed_requests[i] = closed_requests[--closed_len];
      found = 1;
      break;
    }
  pthread_mutex_unlock(&closed_lock);
  return found;
}

/* stream_close(stream): the consumer is done; cancels the request if Triton
 * is still working on it. */
PyObject* py_stream_close(PyObject* self, PyObject* capsule)
{
  (void)self;
  Call* c = (Call*)PyCapsule_GetPointer(capsule, "embedtriton.stream");
  if (c == NULL) return NULL;
  StreamCall* s = (StreamCall*)c;
  if (PyCapsule_SetName(capsule, "embedtriton.closed-stream") < 0) return NULL;
  pthread_mutex_lock(&s->mu);
  s->closed = 1;
  make_room(s);
  int cancel = !s->finished;
  pthread_mutex_unlock(&s->mu);
  if (cancel) call_cancel(c);
  call_unref(c);
  Py_RETURN_NONE;
}
