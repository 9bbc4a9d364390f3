/* How a call's end reaches its caller. Triton's two callbacks (response_cb,
 * release_cb) land here, and call_set_kind, the one place that looks at how a call
 * was submitted, registers its kind's stage hooks (CallOps):
 *   CALL_WAIT    a blocking caller (or submit_many's group) sleeps on c->done: woken
 *                here (after the execute, when one completes it: flush_wakes);
 *   CALL_LOOP    an asyncio future, resolved on its event loop (_complete, mailboxes);
 *   CALL_TARGET  target(outputs, None) or target(None, error), called once here, on
 *                the thread that completes the call, with the GIL (after the execute,
 *                when one completes it: flush_deferred);
 *   CALL_STREAM  several responses, queued for their consumer (streams.c's hooks);
 *   CALL_NATIVE  answered in C by hooks its submitter registers (call_set_ops: the KServe C
 *                paths' calls, kserve_grpc.c and kserve_http.c), without the GIL. */
#include "complete.h"

#include "calls.h"
#include "graveyard.h"
#include "outputs.h"
#include "queues.h"
#include "servers.h"
#include "streams.h"
#include "threads.h"
#include "trace.h"

static void call_target(Call* c);

/* ---- asyncio: event loops' mailboxes ------------------------------------ */

/* Async completions met inside one execute are handed to each event loop in
 * one call_soon_threadsafe (one wake-up of the loop per batch, not per
 * request): t_deferred maps loop -> list of calls while execute runs.
 * Across executes, a loop that has not yet run the _complete it was handed
 * gets later completions added to that same list (its mailbox) instead of
 * another call_soon_threadsafe: under load one wake-up of the loop resolves
 * the completions of many batches. g_mailboxes maps loop -> the list its
 * pending _complete will take; all of it under the GIL. */
__thread PyObject* t_deferred = NULL;
static PyObject* g_mailboxes = NULL;

static void free_calls(PyObject* calls)
{
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(calls); i++)
    call_free((Call*)PyCapsule_GetPointer(PyList_GET_ITEM(calls, i), "embedtriton.call"));
  PyList_SetSlice(calls, 0, PyList_GET_SIZE(calls), NULL);
}

/* Whether an asyncio loop was closed (its pending callbacks will never run). */
static int loop_closed(PyObject* loop)
{
  static PyObject* s_is_closed = NULL;
  if (s_is_closed == NULL && (s_is_closed = PyUnicode_InternFromString("is_closed")) == NULL) {
    PyErr_Clear();
    return 0;
  }
  PyObject* r = PyObject_CallMethodNoArgs(loop, s_is_closed);
  int closed = r == Py_True;
  if (r == NULL) PyErr_Clear(); /* not an asyncio loop: it runs what it is handed */
  Py_XDECREF(r);
  return closed;
}

static void take_mailbox(PyObject* loop, PyObject* calls);

static void hand_to_loop(PyObject* loop, PyObject* calls)
{
  if (g_mailboxes == NULL && (g_mailboxes = PyDict_New()) == NULL) {
    PyErr_WriteUnraisable(loop);
    free_calls(calls);
    return;
  }
  int closed = 0;
  PyObject* mailbox = PyDict_GetItemWithError(g_mailboxes, loop); /* borrowed */
  if (mailbox != NULL) {
    closed = loop_closed(loop); /* Python code: the loop may take its mailbox meanwhile */
    mailbox = PyDict_GetItemWithError(g_mailboxes, loop);
  }
  if (mailbox != NULL) {
    if (!closed) {
      if (PyList_SetSlice(mailbox, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, calls) == 0) return;
      PyErr_WriteUnraisable(loop);
      free_calls(calls);
      return;
    }
    Py_INCREF(mailbox); /* its _complete will never run */
    take_mailbox(loop, mailbox);
    free_calls(mailbox);
    Py_DECREF(mailbox);
  }
  PyErr_Clear();
  if (PyDict_SetItem(g_mailboxes, loop, calls) < 0) {
    PyErr_WriteUnraisable(loop);
    free_calls(calls);
    return;
  }
  /* (an immediate loop runs _complete inside this call, which takes the mailbox back) */
  PyObject* r =
      PyObject_CallMethodObjArgs(loop, s_call_soon_threadsafe, g_complete, loop, calls, NULL);
  if (r == NULL) { /* the loop is closed: nobody is waiting any more (else: say what failed) */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (loop_closed(loop)) {
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(tb);
    } else {
      PyErr_Restore(type, value, tb);
      PyErr_WriteUnraisable(loop);
    }
    take_mailbox(loop, calls);
    free_calls(calls);
  }
  Py_XDECREF(r);
}

/* With the GIL, on the loop (from _complete): the mailbox stops taking completions. */
static void take_mailbox(PyObject* loop, PyObject* calls)
{
  PyObject* mailbox = g_mailboxes ? PyDict_GetItemWithError(g_mailboxes, loop) : NULL;
  if (mailbox == calls && PyDict_DelItem(g_mailboxes, loop) < 0) PyErr_WriteUnraisable(loop);
  PyErr_Clear();
}

/* With the GIL, inside an execute: keep the call's completion for flush_deferred, under
 * key (its loop; None for a call with a target). Returns 0 when it did. */
static int defer(Call* c, PyObject* key)
{
  if (t_deferred == NULL) return -1;
  PyObject* capsule = PyCapsule_New(c, "embedtriton.call", NULL);
  PyObject* calls = capsule ? PyDict_GetItemWithError(t_deferred, key) : NULL;
  if (capsule != NULL && calls == NULL && !PyErr_Occurred()) {
    calls = PyList_New(0);
    if (calls && PyDict_SetItem(t_deferred, key, calls) == 0) Py_DECREF(calls);
    else Py_CLEAR(calls);
  }
  int r = calls != NULL && PyList_Append(calls, capsule) == 0 ? 0 : -1;
  Py_XDECREF(capsule);
  PyErr_Clear();
  return r;
}

/* With the GIL: hand an async call's completion to its event loop. */
static void schedule_async(Call* c)
{
  if (defer(c, c->loop) == 0) return;
  PyObject* capsule = PyCapsule_New(c, "embedtriton.call", NULL);
  if (capsule == NULL) {
    PyErr_WriteUnraisable(NULL);
    return;
  }
  PyObject* calls = PyList_New(1);
  if (calls != NULL) {
    PyList_SET_ITEM(calls, 0, capsule);
    hand_to_loop(c->loop, calls);
    Py_DECREF(calls);
  } else {
    Py_DECREF(capsule);
  }
}

void flush_deferred(void)
{
  PyObject* deferred = t_deferred;
  t_deferred = NULL;
  if (deferred == NULL) return;
  Py_ssize_t pos = 0;
  PyObject *loop, *calls;
  while (PyDict_Next(deferred, &pos, &loop, &calls)) {
    if (loop != Py_None) {
      hand_to_loop(loop, calls);
      continue;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(calls); i++) /* calls with a target */
      call_target((Call*)PyCapsule_GetPointer(PyList_GET_ITEM(calls, i), "embedtriton.call"));
  }
  Py_DECREF(deferred);
}

/* With the GIL: the caller's side takes a finished call's outcome and lets go of the call.
 * Returns its outputs, or NULL with *error its exception (a new reference, or NULL). */
static PyObject* take_outcome(Call* c, PyObject** error)
{
  PyObject* result = call_collect(c);
  *error = NULL;
  if (result == NULL) {
    PyObject *type, *tb;
    PyErr_Fetch(&type, error, &tb);
    PyErr_NormalizeException(&type, error, &tb);
    if (tb != NULL && *error != NULL) PyException_SetTraceback(*error, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
  }
  call_free(c);
  return result;
}

/* With the GIL, on the event loop: resolve one async call's future. */
static int complete_one(Call* c)
{
  PyObject *error, *fut = Py_NewRef(c->to.future);
  PyObject* result = take_outcome(c, &error);
  PyObject* done = PyObject_CallMethodNoArgs(fut, s_done);
  PyObject* r = NULL;
  if (done == Py_False)
    r = PyObject_CallMethodOneArg(fut, result ? s_set_result : s_set_exception,
                                  result ? result : error);
  else if (done != NULL) r = Py_NewRef(Py_None);
  Py_XDECREF(done);
  Py_XDECREF(result);
  Py_XDECREF(error);
  Py_DECREF(fut);
  if (r == NULL) return -1;
  Py_DECREF(r);
  return 0;
}

/* _complete(loop, calls): runs on the event loop; resolves each call's future,
 * including those added to the list after it was handed over (the loop's mailbox). */
PyObject* py_complete(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
  (void)self;
  if (nargs != 2 || !PyList_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "_complete(loop, calls)");
    return NULL;
  }
  PyObject* calls = args[1];
  take_mailbox(args[0], calls);
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(calls); i++) {
    Call* c = (Call*)PyCapsule_GetPointer(PyList_GET_ITEM(calls, i), "embedtriton.call");
    if (c == NULL || complete_one(c) < 0) PyErr_WriteUnraisable(calls);
  }
  Py_RETURN_NONE;
}

/* ---- Triton's callbacks ------------------------------------------------- */

/* A call with one response (not a stream): keep it; the final flag completes the call. */
void call_one_response(Call* c, TRITONSERVER_InferenceResponse* response, uint32_t flags)
{
  if (response != NULL) {
    struct Kept* kept = NULL;
    if (t_sending && !c->ops->free_later && !atomic_load(&c->completed) &&
        (kept = keep_outputs(response, c)) != NULL) {
      delete_sent(response);
      struct Kept* old = atomic_exchange(&c->kept, kept);
      if (old != NULL) kept_free(c, old);
    } else {
      TRITONSERVER_InferenceResponse* old = atomic_load(&c->completed)
                                                ? response /* its caller was let go */
                                                : atomic_exchange(&c->response, response);
      if (old != NULL) bury(NULL, old); /* (a non-decoupled request gets one response) */
    }
  }
  if (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) {
    c->finalized = 1;
    if (call_claim(c)) c->ops->finish(c); /* (unless stop() or the caller got there first) */
    call_unref(c);                        /* Triton's final response */
  }
}

static void response_cb(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp)
{
  Call* c = (Call*)userp;
  c->ops->response(c, response, flags);
}

static void release_cb(TRITONSERVER_InferenceRequest* request, const uint32_t flags, void* userp)
{
  if (flags & RELEASE_RESCHEDULE) return; /* Triton keeps it for another iteration */
  Call* c = (Call*)userp;
  if (atomic_load(&c->gate) != NULL) gate_forget(c); /* let through, never run (see queues.c) */
  held_release(c);
  bury(request, NULL);
  if (c->ops->free_later) { /* nothing of Python to drop here (kserve.c) */
    call_unref(c);
    return;
  }
  int entered = gil_enter();
  if (c->ops->released != NULL) c->ops->released(c, request);
  if (c->trace != NULL) {
    trace_deliver(c->trace);
    c->trace = NULL;
  }
  call_drop_inputs(c);
  call_unref(c);
  gil_leave(entered);
}

/* Triton's two callbacks on c's request (c->request), for every way a request is built: its
 * release and its responses, whose output buffers the allocator asks c for when the caller gave
 * its own (presets) or wants them on a GPU. */
TRITONSERVER_Error* call_bind_request(Call* c)
{
  TRITONSERVER_Error* err =
      api.TRITONSERVER_InferenceRequestSetReleaseCallback(c->request, release_cb, c);
  if (err == NULL)
    err = api.TRITONSERVER_InferenceRequestSetResponseCallback(
        c->request, allocator, c->n_presets || c->out_device >= 0 ? c : NULL, response_cb, c);
  return err;
}

/* ---- the kinds ---------------------------------------------------------- */

/* A sync call is complete: wake its caller (for a call of submit_many, once
 * enough of its group are). */
static void sync_done(Call* c)
{
  Group* g = c->group;
  if (g == NULL) {
    wait_signal(&c->done);
    return;
  }
  atomic_fetch_add(&g->busy, 1); /* (left still counts this call: its caller is still there) */
  atomic_store(&c->done, WAIT_DONE);
  if (atomic_fetch_sub(&g->left, 1) - 1 <= atomic_load(&g->wake_at)) wait_signal(&g->state);
  atomic_fetch_sub(&g->busy, 1); /* the last touch: its caller may return now */
}

/* Triton's final response completed a sync call (on Triton's thread, without the GIL or
 * inside an execute): wake its caller, or once the execute lets go of the GIL. */
static void sync_finish(Call* c)
{
  if (c->group == NULL && t_in_execute && t_wake_cap > t_wake_len) t_wake[t_wake_len++] = &c->done;
  else sync_done(c);
}

static void loop_finish(Call* c)
{
  int entered = gil_enter();
  schedule_async(c);
  gil_leave(entered);
}

/* With the GIL: call the target (the caller's side is then done with the call). */
static void call_target(Call* c)
{
  PyObject *error, *target = Py_NewRef(c->to.target);
  PyObject* result = take_outcome(c, &error);
  PyObject* r = PyObject_CallFunctionObjArgs(target, result ? result : Py_None,
                                             error ? error : Py_None, NULL);
  if (r == NULL) PyErr_WriteUnraisable(target);
  Py_XDECREF(r);
  Py_XDECREF(result);
  Py_XDECREF(error);
  Py_DECREF(target);
}

static void target_finish(Call* c)
{
  int entered = gil_enter();
  if (defer(c, Py_None) < 0) call_target(c);
  gil_leave(entered);
}

static const CallOps wait_ops = {
    .response = call_one_response, .finish = sync_finish, .wake = sync_done};
static const CallOps loop_ops = {
    .response = call_one_response, .finish = loop_finish, .wake = schedule_async};
static const CallOps target_ops = {
    .response = call_one_response, .finish = target_finish, .wake = target_finish};

/* The call's kind, from submit()'s loop, target and stream, and its hooks; the call holds
 * the loop and what completes its caller (c->loop, c->to; call_free lets go of them). */
void call_set_kind(Call* c, int stream, PyObject* loop, PyObject* target)
{
  c->kind = stream              ? CALL_STREAM
            : loop != Py_None   ? CALL_LOOP
            : target != Py_None ? CALL_TARGET
                                : CALL_WAIT;
  switch (c->kind) {
    case CALL_WAIT: c->ops = &wait_ops; break;
    case CALL_LOOP: c->ops = &loop_ops; break;
    case CALL_TARGET: c->ops = &target_ops; break;
    case CALL_STREAM: c->ops = &stream_ops; break;
    case CALL_NATIVE: break; /* (call_set_ops) */
  }
  if (loop != Py_None) c->loop = Py_NewRef(loop);
  if (target == Py_None) target = NULL;
  switch (c->kind) {
    case CALL_LOOP: c->to.future = Py_XNewRef(target); break;
    case CALL_TARGET: c->to.target = Py_XNewRef(target); break;
    case CALL_STREAM: c->to.wake = Py_XNewRef(target); break; /* (None: read without a loop) */
    default: break;
  }
  atomic_init(&c->done, WAIT_PENDING);
  c->is_async = c->kind == CALL_LOOP || c->kind == CALL_TARGET;
}

/* A call completed by hooks of its submitter's own (the KServe C paths' calls): asynchronous. */
void call_set_ops(Call* c, const CallOps* ops)
{
  c->kind = CALL_NATIVE;
  c->ops = ops;
  atomic_init(&c->done, WAIT_PENDING);
  c->is_async = 1;
}
