/* The graveyard: requests and responses Triton let go of are deleted late, in
 * generations, never inside Triton's callbacks (drain, drain_graveyard). */
#include "native.h"

/* Requests and responses hold references to their model, and the last one
 * to go lets Triton delete a model that was unloaded meanwhile. Triton 2.51's
 * model deletion reads the instance thread's bookkeeping without a lock
 * (TritonBackendThread::StopBackendThread), so it must not start while that
 * thread is still finishing the batch it just ran: it crashes there. So we
 * delete them late, never inside Triton's callbacks, and only 20-40 ms after
 * Triton let go of them: two generations, rotated every 20 ms by whichever
 * caller comes by (drain_graveyard). */
typedef struct Grave {
  struct Grave* next;
  TRITONSERVER_InferenceRequest* request;
  TRITONSERVER_InferenceResponse* response;
} Grave;
#define GRAVE_AGE_NS 20000000ull
static _Atomic(Grave*) graveyard = NULL; /* buried since the last rotation */
static Grave* graveyard_old = NULL;      /* buried in the rotation before */
static uint64_t graveyard_rotated = 0;
static pthread_mutex_t graveyard_lock = PTHREAD_MUTEX_INITIALIZER;

void bury(TRITONSERVER_InferenceRequest* request, TRITONSERVER_InferenceResponse* response)
{
  Grave* g = malloc(sizeof(Grave));
  if (g == NULL) return; /* leak rather than crash */
  g->request = request;
  g->response = response;
  g->next = atomic_load(&graveyard);
  while (!atomic_compare_exchange_weak(&graveyard, &g->next, g)) {
  }
}

static long delete_graves(Grave* g)
{
  long n = 0;
  while (g != NULL) {
    Grave* next = g->next;
    if (g->request) api.TRITONSERVER_InferenceRequestDelete(g->request);
    if (g->response) api.TRITONSERVER_InferenceResponseDelete(g->response);
    free(g);
    g = next;
    n++;
  }
  return n;
}

/* Delete what was buried 20-40 ms ago. Returns how many are still waiting. */
long drain_graveyard(void)
{
  if (graveyard_old == NULL && atomic_load_explicit(&graveyard, memory_order_relaxed) == NULL)
    return 0;
  uint64_t now = now_ns();
  if (now - graveyard_rotated >= GRAVE_AGE_NS && pthread_mutex_trylock(&graveyard_lock) == 0) {
    if (now - graveyard_rotated >= GRAVE_AGE_NS) {
      Grave* old = graveyard_old;
      graveyard_old = atomic_exchange(&graveyard, NULL);
      graveyard_rotated = now;
      delete_graves(old);
    }
    pthread_mutex_unlock(&graveyard_lock);
  }
  return (graveyard_old != NULL) + (atomic_load(&graveyard) != NULL);
}

/* drain() -> how many are still waiting (see drain_graveyard). */
PyObject* py_drain(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  long n;
  Py_BEGIN_ALLOW_THREADS
  pthread_rwlock_rdlock(&servers_lock);
  n = drain_graveyard();
  pthread_rwlock_unlock(&servers_lock);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(n);
}
