/* A bound model's gate (queues.c says what it does): its life (made from the binding's
 * queue_gate at TRITONBACKEND_ModelInitialize, closed with the model, freed with its last
 * reference), the registry that submit() and the C paths look it up in, and its statistics. */
#include "gates.h"

pthread_rwlock_t gate_registry_lock = PTHREAD_RWLOCK_INITIALIZER;
Gate* gate_registry = NULL;
static atomic_int gate_registry_size = 0;

void gate_unref(Gate* g)
{
  if (atomic_fetch_sub(&g->refs, 1) != 1) return;
  pthread_mutex_destroy(&g->mu);
  free(g->pend);
  free(g->policies);
  free(g->levels);
  free(g->model);
  free(g);
}

/* With the GIL: a gate from a binding's queue_gate, (limit, default level index, ((delay,
 * timeout_us, allow_override, max_size), ...) per level); registered for submit(). NULL with
 * a Python error. */
Gate* gate_new(PyObject* spec, TRITONSERVER_Server* server, const char* model, long long version,
               int release_gil)
{
  unsigned long long limit = 0;
  int default_level = 0;
  PyObject* levels = NULL;
  if (!PyArg_ParseTuple(spec, "KiO!", &limit, &default_level, &PyTuple_Type, &levels)) return NULL;
  Py_ssize_t n = PyTuple_GET_SIZE(levels);
  if (n < 1 || default_level < 0 || default_level >= n) {
    PyErr_SetString(PyExc_ValueError, "queue_gate: bad levels");
    return NULL;
  }
  Gate* g = calloc(1, sizeof(Gate));
  if (g == NULL) return (Gate*)PyErr_NoMemory();
  g->policies = calloc((size_t)n, sizeof(GatePolicy));
  g->levels = calloc((size_t)n, sizeof(GateLevel));
  g->model = strdup(model);
  if (g->policies == NULL || g->levels == NULL || g->model == NULL) {
    atomic_init(&g->refs, 1);
    gate_unref(g);
    return (Gate*)PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    GatePolicy* p = &g->policies[i];
    unsigned long long timeout = 0, size = 0;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(levels, i), "pKpK", &p->delay, &timeout,
                          &p->allow_override, &size)) {
      atomic_init(&g->refs, 1);
      gate_unref(g);
      return NULL;
    }
    p->timeout_us = timeout;
    p->max_size = size;
  }
  g->limit = limit ? limit : 1;
  g->n_levels = (int)n;
  g->default_level = default_level;
  g->server = server;
  g->version = version;
  g->release_gil = release_gil;
  pthread_mutex_init(&g->mu, NULL);
  atomic_init(&g->refs, 2); /* the registry's and the model's */
  pthread_rwlock_wrlock(&gate_registry_lock);
  g->next = gate_registry;
  gate_registry = g;
  atomic_fetch_add(&gate_registry_size, 1);
  pthread_rwlock_unlock(&gate_registry_lock);
  return g;
}

/* The model is finalized: submit() no longer finds the gate (calls it holds keep the model
 * alive, so none is left by now), and the model drops its reference. */
void gate_close(Gate* g)
{
  pthread_rwlock_wrlock(&gate_registry_lock);
  for (Gate** p = &gate_registry; *p != NULL; p = &(*p)->next)
    if (*p == g) {
      *p = g->next;
      atomic_fetch_sub(&gate_registry_size, 1);
      gate_unref(g); /* the registry's */
      break;
    }
  pthread_rwlock_unlock(&gate_registry_lock);
  gate_unref(g);
}

/* submit(): the gate of (server, model, version), with a reference; NULL when it has none.
 * Version -1 (Triton's choice) finds the highest version's. The newest gate comes first (a
 * model being reloaded has two for a while). */
Gate* gate_find(TRITONSERVER_Server* server, const char* model, long long version)
{
  if (atomic_load(&gate_registry_size) == 0) return NULL;
  Gate* found = NULL;
  pthread_rwlock_rdlock(&gate_registry_lock);
  for (Gate* g = gate_registry; g != NULL; g = g->next) {
    if (g->server != server || strcmp(g->model, model) != 0) continue;
    if (version >= 0 ? g->version == version : found == NULL || g->version > found->version)
      found = g;
    if (found != NULL && version >= 0) break;
  }
  if (found != NULL) atomic_fetch_add(&found->refs, 1);
  pthread_rwlock_unlock(&gate_registry_lock);
  return found;
}

void gate_release_ref(Gate* g)
{
  gate_unref(g);
}

/* gate_stats(server) -> [(model, version, waiting, waited_ns, rejected, rejected_ns, cancelled,
 * cancelled_ns)]: what Triton's metrics and statistics do not see of each gate of the server
 * (requests waiting in it; time waited in it by those let through; those it failed). */
PyObject* py_gate_stats(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = (TRITONSERVER_Server*)PyLong_AsVoidPtr(arg);
  if (PyErr_Occurred()) return NULL;
  PyObject* out = PyList_New(0);
  if (out == NULL) return NULL;
  pthread_rwlock_rdlock(&gate_registry_lock);
  for (Gate* g = gate_registry; g != NULL; g = g->next) {
    if (g->server != server) continue;
    pthread_mutex_lock(&g->mu);
    unsigned long long n[7] = {
        g->held, g->waited_ns, g->rejected, g->rejected_ns, g->cancelled, g->cancelled_ns, 0};
    pthread_mutex_unlock(&g->mu);
    PyObject* item =
        Py_BuildValue("(sLKKKKKK)", g->model, g->version, n[0], n[1], n[2], n[3], n[4], n[5]);
    if (item == NULL || PyList_Append(out, item) < 0) {
      Py_XDECREF(item);
      Py_CLEAR(out);
      break;
    }
    Py_DECREF(item);
  }
  pthread_rwlock_unlock(&gate_registry_lock);
  return out;
}
