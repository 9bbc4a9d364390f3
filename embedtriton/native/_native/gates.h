/* gates.c: a bound model's gate (queue policies and priority levels, queues.c) and the registry
 * of them. Its fields are queues.c's and gates.c's. */
#ifndef EMBEDTRITON_GATES_H
#define EMBEDTRITON_GATES_H

#include "calls.h"

typedef struct Gate Gate;

typedef struct {
  int delay;           /* TimeoutAction DELAY (REJECT otherwise) */
  uint64_t timeout_us; /* default_timeout_microseconds; 0: none */
  int allow_override;  /* a request's timeout_us may shorten it */
  uint64_t max_size;   /* max_queue_size; 0: unbounded */
} GatePolicy;

typedef struct {
  Call *head, *tail;   /* waiting, in arrival order */
  Call *dhead, *dtail; /* timed out under DELAY: after the others of the level */
  uint64_t size;       /* both (Triton's queue size of the level) */
} GateLevel;

struct Gate {
  struct Gate* next; /* the registry */
  atomic_int refs;   /* the registry's, the model's, and one per call held or let through */
  TRITONSERVER_Server* server;
  char* model;
  long long version;
  int release_gil; /* a batch rule: Triton's batcher takes the GIL under its queue lock */
  pthread_mutex_t mu;
  int instances, busy; /* the model's instances; those running a callable */
  uint64_t limit;      /* requests one instance takes at once (a batch) */
  uint64_t pending;    /* calls let through to Triton and not started */
  Call** pend;
  uint64_t pend_cap;
  uint64_t held; /* calls waiting here, all levels */
  int n_levels, default_level;
  GatePolicy* policies;
  GateLevel* levels;
  /* what Triton's statistics do not see: time waited here by the calls let through, and the
   * calls failed here (timeout, cancel) with the time they waited */
  uint64_t waited_ns, rejected, rejected_ns, cancelled, cancelled_ns;
};

/* The gates of the loaded models, newest first (queues.c's timer sweeps them). */
extern pthread_rwlock_t gate_registry_lock;
extern Gate* gate_registry;

Gate* gate_new(PyObject* spec, TRITONSERVER_Server* server, const char* model, long long version,
               int release_gil);
void gate_close(Gate* g);
Gate* gate_find(TRITONSERVER_Server* server, const char* model, long long version);
/* A reference let go of: the last one frees the gate (gate_release_ref is gate_find's). */
void gate_unref(Gate* g);
void gate_release_ref(Gate* g);
PyObject* py_gate_stats(PyObject* self, PyObject* arg);

#endif
