/* Servers and the calls Triton holds for them: whether submit() accepts
 * requests for a server (open_server, close_server), and what stop() does with
 * a server's calls (count, cancel, fail and abort them). */
#include "native.h"

/* Servers that accept requests. submit() holds the read lock while it hands
 * a request over, so stop() (write lock) never deletes a server under it. */
#define MAX_SERVERS 64
pthread_rwlock_t servers_lock = PTHREAD_RWLOCK_INITIALIZER;
static TRITONSERVER_Server* servers[MAX_SERVERS];
/* Servers that stop() drains: they take only requests made by a model's callable (a
 * model-to-model call of a request in flight), until stop()'s deadline fails what is left. */
static TRITONSERVER_Server* draining[MAX_SERVERS];

int server_is_open(TRITONSERVER_Server* s)
{
  for (int i = 0; i < MAX_SERVERS; i++)
    if (servers[i] == s) return 1;
  if (t_in_execute || t_model_thread)
    for (int i = 0; i < MAX_SERVERS; i++)
      if (draining[i] == s) return 1;
  return 0;
}

/* Calls whose request Triton holds (from submit until its release), for
 * stop(): cancelling, failing and counting what a server still has. */
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static Call held = {&held, &held};

void held_add(Call* c)
{
  pthread_mutex_lock(&held_lock);
  c->next = held.next;
  c->prev = &held;
  held.next->prev = c;
  held.next = c;
  pthread_mutex_unlock(&held_lock);
}

/* Triton let go of the request (or never took it): it leaves the list. */
void held_release(Call* c)
{
  pthread_mutex_lock(&held_lock);
  if (c->next != NULL) {
    c->prev->next = c->next;
    c->next->prev = c->prev;
    c->next = c->prev = NULL;
  }
  c->released = 1;
  pthread_mutex_unlock(&held_lock);
}

/* Holding held_lock: mark the request cancelled if Triton still holds it (Triton
 * only sets a flag; a released request is buried, not deleted, so the pointer is
 * still Triton's). A stream's request is also listed as closed for the iterative
 * path, where the flag does not survive a RESCHEDULE release. */
static void cancel_held_locked(Call* c)
{
  if (c->released) return;
  if (c->is_stream) mark_stream_closed(c->request);
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceRequestCancel(c->request);
  if (err != NULL) api.TRITONSERVER_ErrorDelete(err);
}

void call_cancel(Call* c)
{
  pthread_mutex_lock(&held_lock);
  int taken = !c->released && gate_take(c); /* waiting in its queue policy's gate */
  if (!taken) cancel_held_locked(c);
  pthread_mutex_unlock(&held_lock);
  if (taken) gate_fail_cancelled(c);
}

/* With the GIL: wake the caller of a call completed here, not by Triton (claimed by
 * the caller of this): its stream ends, its future is resolved or its thread woken. */
void call_wake_caller(Call* c)
{
  if (c->is_stream) {
    pthread_mutex_lock(&c->mu);
    c->finished = 1;
    pthread_cond_signal(&c->cv);
    int notify = !c->closed && c->loop != NULL;
    pthread_mutex_unlock(&c->mu);
    if (notify) wake_stream_consumer(c);
  } else if (c->is_async) {
    schedule_async(c);
  } else {
    sync_done(c);
  }
}

/* With the GIL: complete a call that Triton did not complete (claimed by the
 * caller of this): its caller gets an UnavailableError. */
static void call_abort(Call* c)
{
  c->aborted = 1;
  call_wake_caller(c);
}

static TRITONSERVER_Server* server_arg(PyObject* arg)
{
  return (TRITONSERVER_Server*)PyLong_AsVoidPtr(arg);
}

/* pending(server) -> (calls not completed, requests Triton still holds). */
PyObject* py_pending(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = server_arg(arg);
  if (PyErr_Occurred()) return NULL;
  long waiting = 0, holding = 0;
  pthread_mutex_lock(&held_lock);
  for (Call* c = held.next; c != &held; c = c->next)
    if (c->server == server) {
      holding++;
      waiting += !atomic_load(&c->completed);
    }
  pthread_mutex_unlock(&held_lock);
  return Py_BuildValue("(ll)", waiting, holding);
}

/* cancel_all(server): mark every request Triton holds for the server
 * cancelled (queued ones are dropped by Triton's scheduler; a running
 * decoupled model stops at its next step). Returns the count. */
PyObject* py_cancel_all(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = server_arg(arg);
  if (PyErr_Occurred()) return NULL;
  long n = 0;
  Call** taken = NULL; /* calls waiting in a gate (queues.c): failed once the lock is let go */
  size_t n_taken = 0, cap = 0;
  pthread_mutex_lock(&held_lock);
  for (Call* c = held.next; c != &held; c = c->next)
    if (c->server == server) {
      n++;
      if (n_taken == cap) {
        size_t grown_cap = cap ? 2 * cap : 16;
        Call** grown = realloc(taken, grown_cap * sizeof(Call*));
        if (grown != NULL) taken = grown, cap = grown_cap;
      }
      if (n_taken < cap && gate_take(c)) {
        atomic_fetch_add(&c->refs, 1); /* keep it until it is failed below */
        taken[n_taken++] = c;
      } else {
        cancel_held_locked(c);
      }
    }
  pthread_mutex_unlock(&held_lock);
  for (size_t i = 0; i < n_taken; i++) {
    gate_fail_cancelled(taken[i]);
    call_unref(taken[i]);
  }
  free(taken);
  return PyLong_FromLong(n);
}

/* Claim (under held_lock) up to cap calls of server that are not completed. */
static size_t claim_waiting(TRITONSERVER_Server* server, Call** out, size_t cap)
{
  size_t n = 0;
  pthread_mutex_lock(&held_lock);
  for (Call* c = held.next; c != &held && n < cap; c = c->next)
    if (c->server == server && call_claim(c)) out[n++] = c;
  pthread_mutex_unlock(&held_lock);
  return n;
}

/* fail_pending(server): stop()'s deadline passed: every call of the server
 * that Triton has not completed fails now (UnavailableError); what Triton
 * still runs finishes on its own and its late responses are dropped. A
 * claimed call stays alive: its caller's reference is only dropped once it
 * has been told. Returns the count. */
PyObject* py_fail_pending(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = server_arg(arg);
  if (PyErr_Occurred()) return NULL;
  Py_BEGIN_ALLOW_THREADS
  end_drain(server); /* no new model-to-model calls: they would not be failed here */
  Py_END_ALLOW_THREADS
  long n = 0;
  Call* batch[256];
  size_t got;
  while ((got = claim_waiting(server, batch, 256)) > 0) {
    for (size_t i = 0; i < got; i++) call_abort(batch[i]);
    n += (long)got;
  }
  return PyLong_FromLong(n);
}

/* abort_pending(server): after the server is deleted, no callback will come:
 * fail what is left and drop Triton's references. Returns the count. */
PyObject* py_abort_pending(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = server_arg(arg);
  if (PyErr_Occurred()) return NULL;
  long n = 0;
  for (;;) {
    Call* found = NULL;
    pthread_mutex_lock(&held_lock);
    for (Call* c = held.next; c != &held; c = c->next)
      if (c->server == server) {
        found = c;
        break;
      }
    pthread_mutex_unlock(&held_lock);
    if (found == NULL) break;
    n++;
    gate_drop(found); /* (never handed to Triton: only its gate knew it) */
    held_release(found);
    atomic_fetch_add(&found->refs, 1); /* keep it while we tell its caller */
    if (call_claim(found)) call_abort(found);
    call_drop_inputs(found);
    if (!found->finalized) {
      found->finalized = 1;
      call_unref(found); /* Triton's final response */
    }
    call_unref(found); /* Triton's release */
    call_unref(found);
  }
  return PyLong_FromLong(n);
}

/* open_server(handle) / close_server(handle): whether submit() accepts
 * requests for it. close_server waits for submissions under way. */
PyObject* py_open_server(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = (TRITONSERVER_Server*)PyLong_AsVoidPtr(arg);
  if (PyErr_Occurred()) return NULL;
  int placed = 0;
  pthread_rwlock_wrlock(&servers_lock);
  for (int i = 0; i < MAX_SERVERS && !placed; i++)
    if (servers[i] == NULL) servers[i] = server, placed = 1;
  pthread_rwlock_unlock(&servers_lock);
  if (!placed)
    return raise_triton(TRITONSERVER_ERROR_UNAVAILABLE, "too many servers running at once");
  Py_RETURN_NONE;
}

PyObject* py_close_server(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = (TRITONSERVER_Server*)PyLong_AsVoidPtr(arg);
  if (PyErr_Occurred()) return NULL;
  Py_BEGIN_ALLOW_THREADS
  pthread_rwlock_wrlock(&servers_lock);
  for (int i = 0; i < MAX_SERVERS; i++)
    if (servers[i] == server) {
      servers[i] = NULL;
      draining[i] = server;
    }
  pthread_rwlock_unlock(&servers_lock);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

/* End a server's drain (stop()'s deadline): from now on nothing is accepted for it. */
void end_drain(TRITONSERVER_Server* server)
{
  pthread_rwlock_wrlock(&servers_lock);
  for (int i = 0; i < MAX_SERVERS; i++)
    if (draining[i] == server) draining[i] = NULL;
  pthread_rwlock_unlock(&servers_lock);
}
