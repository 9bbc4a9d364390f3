/* The graveyard: requests and responses Triton let go of are deleted late, in
 * generations, never inside Triton's callbacks (delete_released, delete_buried). */
#include "graveyard.h"

/* Requests and responses hold references to their model, and the last one
 * to go lets Triton delete a model that was unloaded meanwhile. Triton 2.51's
 * model deletion reads the instance thread's bookkeeping without a lock
 * (TritonBackendThread::StopBackendThread), so it must not start while that
 * thread is still finishing the batch it just ran: it crashes there. So we
 * delete them late, never inside Triton's callbacks, and only 20 ms or more
 * after Triton let go of them: generations rotated every 20 ms (or later) by
 * whichever caller comes by (delete_buried). A generation that is old
 * enough is deleted a few at a time by each call (GRAVE_STEP_*), not at once:
 * deleting 20 ms of requests in one go held one caller (with the GIL) for a
 * millisecond, every 20 ms. A sync caller deletes while it waits for its own
 * call, without the GIL; an async one as it submits; a callable calling
 * another model does not (the delete could end its own model). stop() waits until
 * nothing is left and no delete is under way (delete_released) before it deletes the
 * server. */
typedef struct Grave {
  struct Grave* next;
  TRITONSERVER_InferenceRequest* request;
  TRITONSERVER_InferenceResponse* response;
} Grave;
#define GRAVE_AGE_NS 20000000ull
static _Atomic(Grave*) graveyard = NULL; /* buried since the last rotation */
static Grave* graveyard_old = NULL;      /* buried in the rotation before: still too young */
static Grave* graveyard_ready = NULL;    /* old enough: being deleted */
static atomic_int deleting = 0;          /* delete_buried calls under way */
static uint64_t graveyard_rotated = 0;
static pthread_mutex_t graveyard_lock = PTHREAD_MUTEX_INITIALIZER;

/* Responses deleted where our backend sent them (outputs.c keep_outputs), and those buried. */
static atomic_llong n_responses_kept = 0;
static atomic_llong n_responses_buried = 0;

/* Inside our backend's send (t_sending), on the thread that made it: delete a response now,
 * not late (see keep_outputs for why that is safe there). */
void delete_sent(TRITONSERVER_InferenceResponse* response)
{
  api.TRITONSERVER_InferenceResponseDelete(response);
  atomic_fetch_add_explicit(&n_responses_kept, 1, memory_order_relaxed);
}

void bury(TRITONSERVER_InferenceRequest* request, TRITONSERVER_InferenceResponse* response)
{
  if (response != NULL) atomic_fetch_add_explicit(&n_responses_buried, 1, memory_order_relaxed);
  Grave* g = malloc(sizeof(Grave));
  if (g == NULL) return; /* leak rather than crash */
  g->request = request;
  g->response = response;
  g->next = atomic_load(&graveyard);
  while (!atomic_compare_exchange_weak(&graveyard, &g->next, g)) {
  }
}

/* Delete up to limit (0: all) of the ready graves, under graveyard_lock. */
static void delete_graves(long limit)
{
  for (long n = 0; graveyard_ready != NULL && (limit == 0 || n < limit); n++) {
    Grave* g = graveyard_ready;
    graveyard_ready = g->next;
    if (g->request) api.TRITONSERVER_InferenceRequestDelete(g->request);
    if (g->response) api.TRITONSERVER_InferenceResponseDelete(g->response);
    free(g);
  }
}

/* Delete up to limit (0: all) of what was buried 20 ms ago or more. Returns
 * how many generations are still waiting, plus the deletes under way. */
long delete_buried(long limit)
{
  if (graveyard_ready == NULL && graveyard_old == NULL &&
      atomic_load_explicit(&graveyard, memory_order_relaxed) == NULL)
    return atomic_load(&deleting);
  if (t_in_execute && limit) return 1; /* not on a model's own thread (see above) */
  atomic_fetch_add(&deleting, 1);
  if (pthread_mutex_trylock(&graveyard_lock) == 0) {
    uint64_t now;
    if (graveyard_ready == NULL && (now = now_ns()) - graveyard_rotated >= GRAVE_AGE_NS) {
      graveyard_ready = graveyard_old;
      graveyard_old = atomic_exchange(&graveyard, NULL);
      graveyard_rotated = now;
    }
    delete_graves(limit);
    pthread_mutex_unlock(&graveyard_lock);
  }
  long left =
      (graveyard_ready != NULL) + (graveyard_old != NULL) + (atomic_load(&graveyard) != NULL);
  return left + atomic_fetch_sub(&deleting, 1) - 1;
}

/* delete_released() -> how many are still waiting (see delete_buried). */
PyObject* py_delete_released(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  long n;
  Py_BEGIN_ALLOW_THREADS
  n = delete_buried(0);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(n);
}

/* response_stats() -> (kept, buried): responses read and deleted on the thread that sent them,
 * and responses left to the graveyard. */
PyObject* py_response_stats(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  return Py_BuildValue("(LL)", (long long)atomic_load(&n_responses_kept),
                       (long long)atomic_load(&n_responses_buried));
}
