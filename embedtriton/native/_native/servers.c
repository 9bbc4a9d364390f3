/* Servers and the calls Triton holds for them: whether submit() accepts
 * requests for a server (open_server, close_server), the held list (from submit
 * until Triton's release) and its walks for cancel.c, and Triton's cancellation
 * flag on a held request. What to do with the calls found (fail, abort) is
 * cancel.c's. */
#include "servers.h"

#include "calls.h"

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
 * still Triton's). Its kind may want to know (a stream lists its request as closed
 * for the iterative path, where the flag does not survive a RESCHEDULE release). */
static void cancel_held_locked(Call* c)
{
  if (c->released) return;
  if (c->ops->cancelled != NULL) c->ops->cancelled(c);
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceRequestCancel(c->request);
  if (err != NULL) api.TRITONSERVER_ErrorDelete(err);
}

/* Cancel one call: unless take(c) (under held_lock, while Triton has not released it)
 * takes it out of where it waits instead (a queue policy's gate). Returns whether it did. */
int held_cancel(Call* c, int (*take)(Call*))
{
  pthread_mutex_lock(&held_lock);
  int taken = !c->released && take(c);
  if (!taken) cancel_held_locked(c);
  pthread_mutex_unlock(&held_lock);
  return taken;
}

/* Cancel every call the server holds, or take it with take(c) as held_cancel does: the
 * calls taken are listed in *out (malloc'ed, *n_out of them), each with a reference added.
 * Returns how many calls the server holds. */
long held_cancel_server(TRITONSERVER_Server* server, int (*take)(Call*), Call*** out, size_t* n_out)
{
  long n = 0;
  Call** taken = NULL;
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
      if (n_taken < cap && take(c)) {
        atomic_fetch_add(&c->refs, 1); /* keep it until its caller is told */
        taken[n_taken++] = c;
      } else {
        cancel_held_locked(c);
      }
    }
  pthread_mutex_unlock(&held_lock);
  *out = taken;
  *n_out = n_taken;
  return n;
}

/* Claim (under held_lock) up to cap calls of server that are not completed. */
size_t held_claim_waiting(TRITONSERVER_Server* server, Call** out, size_t cap)
{
  size_t n = 0;
  pthread_mutex_lock(&held_lock);
  for (Call* c = held.next; c != &held && n < cap; c = c->next)
    if (c->server == server && call_claim(c)) out[n++] = c;
  pthread_mutex_unlock(&held_lock);
  return n;
}

/* A call the server still holds, or NULL. */
Call* held_find(TRITONSERVER_Server* server)
{
  Call* found = NULL;
  pthread_mutex_lock(&held_lock);
  for (Call* c = held.next; c != &held; c = c->next)
    if (c->server == server) {
      found = c;
      break;
    }
  pthread_mutex_unlock(&held_lock);
  return found;
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
