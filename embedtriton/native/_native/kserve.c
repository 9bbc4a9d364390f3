/* What the C paths of the KServe endpoints share (kserve_grpc.c: a unary gRPC ModelInfer;
 * kserve_http.c: an HTTP/REST inference): each decodes a request into a Triton request whose
 * inputs point into the received message or body (no copy, where they are aligned for their
 * datatype), hands it to Triton and answers it on Triton's thread through _h2's C interface
 * (h2_reply.h), without the GIL: no Python on the completion path. Here: the per-thread
 * decoding space, the call (KsCall) and its hand-over to Triton, the table of the models the C
 * paths may take, and the answered calls let go of with the GIL (ks_release). */
#include "kserve.h"

#include "calls.h"
#include "complete.h"
#include "gates.h"
#include "graveyard.h"
#include "kserve_json.h"
#include "kserve_pb.h"
#include "outputs.h"
#include "request.h"
#include "servers.h"
#include "threads.h"

#include <pthread.h>

/* ---- the decoding space ---------------------------------------------------- */

/* A request's decoded form (KjRequest, which holds a KsRequest first: ~21 KB for KS_MAX_TENSORS
 * inputs of MAX_DIMS dimensions) is kept per thread, not allocated per request: a malloc and
 * free of that size at each request took glibc's large-chunk path (and malloc_consolidate),
 * ~3 % of the HTTP IO thread's samples at c16. Freed when its thread ends. Never nested: what
 * uses it (grpc_model_infer, http_submit) calls neither again before it is done with it. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_key_make(void)
{
  (void)pthread_key_create(&scratch_key, free);
}

/* This thread's decoding space, or NULL when out of memory. */
KjRequest* scratch(void)
{
  pthread_once(&scratch_once, scratch_key_make);
  KjRequest* q = pthread_getspecific(scratch_key);
  if (q == NULL && (q = malloc(sizeof(KjRequest))) != NULL &&
      pthread_setspecific(scratch_key, q) != 0) {
    free(q);
    q = NULL;
  }
  return q;
}

/* Triton's error codes as gRPC status codes (frontends/statuses.py, test_statuses.py). */
static int grpc_code(int code)
{
  static const int codes[] = {13, 13, 5, 3, 14, 12, 6, 1};
  return code >= 0 && code < (int)(sizeof codes / sizeof codes[0]) ? codes[code] : 13;
}

/* Triton's HTTP status of an error code (frontends/statuses.py; tests/unit/test_statuses.py). */
static int http_status(int code)
{
  static const int statuses[] = {400, 500, 404, 400, 503, 501, 400, 400};
  return code >= 0 && code < (int)(sizeof statuses / sizeof statuses[0]) ? statuses[code] : 400;
}

/* The status a transport answers a Triton error code with: gRPC's, or (http) HTTP's. (The two
 * tables, the C copies of frontends/statuses.py, stay here: tests/unit/test_statuses.py reads
 * them in this file.) */
int ks_status(int code, int http)
{
  return http ? http_status(code) : grpc_code(code);
}

/* A Triton error message without its "[request id: ...] " prefix (error_for_code). */
const char* without_request_id(const char* m)
{
  if (strncmp(m, "[request id: ", 13) == 0) {
    const char* end = strstr(m, "] ");
    if (end != NULL && end > m) return end + 2;
  }
  return m;
}

const H2Reply* ks_h2 = NULL;

/* Calls answered on Triton's threads: their _h2 call (which holds the cancel handle, which holds
 * the call) and the caller's reference are let go of by the next ks_release, with the GIL. */
static _Atomic(KsCall*) answered = NULL;

/* With the GIL: let go of what answered calls hold, and free those that are done. Returns how
 * many it let go of. */
Py_ssize_t ks_release(void)
{
  Py_ssize_t n = 0;
  KsCall* g = atomic_load_explicit(&answered, memory_order_relaxed)
                  ? atomic_exchange(&answered, NULL)
                  : NULL;
  while (g != NULL) {
    KsCall* next = g->answered_next;
    Py_CLEAR(g->call); /* (gRPC's; an HTTP answer took it) */
    call_unref(&g->c); /* the caller's */
    g = next;
    n++;
  }
  call_free_later();
  return n;
}

/* After the answer (Triton's thread, no GIL): Triton's response goes, and the call waits for
 * the next ks_release. */
void ks_after_answer(Call* c)
{
  KsCall* g = (KsCall*)c;
  TRITONSERVER_InferenceResponse* resp = atomic_exchange(&c->response, NULL);
  if (resp != NULL && t_sending) /* our backend's send: on the thread that made it (outputs.c) */
    delete_sent(resp);
  else if (resp != NULL) bury(NULL, resp); /* (its model may go once Triton deleted it) */
  g->answered_next = atomic_load(&answered);
  while (!atomic_compare_exchange_weak(&answered, &g->answered_next, g)) {
  }
}

/* With the GIL (call_free_later): the message Triton read from, and copies of it. */
void ks_destroy(Call* c)
{
  KsCall* g = (KsCall*)c;
  call_drop_inputs(c);
  Py_CLEAR(g->call); /* (answered: already let go of) */
  free(g->copies);
  free(g->values);
  free(g->outputs);
}

int ks_load_h2(void)
{
  if (ks_h2 == NULL) {
    ks_h2 = PyCapsule_Import(H2_REPLY_CAPSULE, 0);
    if (ks_h2 == NULL) PyErr_Clear();
  }
  return ks_h2 != NULL ? 0 : -1;
}

/* Whether a Triton call succeeded (its error dropped). */
static int fine(TRITONSERVER_Error* err)
{
  if (err != NULL) api.TRITONSERVER_ErrorDelete(err);
  return err == NULL;
}

/* r's inputs, outputs and id on req, for g (NULL: out of memory, nothing done). Inputs point into
 * the message. One whose bytes are not aligned there for its datatype is copied (into one block
 * for all of them, g->copies): the model's arrays are aligned, as they are on the Python path,
 * where protobuf copies each raw content into a bytes object of its own. Returns whether all of
 * it went well (the Python path words what did not). */
static int ks_build(TRITONSERVER_InferenceRequest* req, const KsRequest* r, KsCall* g)
{
  char text[256]; /* one name at a time, NUL-terminated for Triton (which copies it) */
#define TEXT(s) (s.n < sizeof text ? (memcpy(text, s.p, s.n), text[s.n] = 0, text) : NULL)
  int ok = g != NULL;
  size_t copied = 0;
  for (int i = 0; i < r->n_inputs; i++)
    if ((uintptr_t)r->raw[i].p % dtype_size(numeric_type(r->inputs[i].datatype)))
      copied += (r->raw[i].n + 63) & ~(size_t)63;
  if (ok && copied && posix_memalign(&g->copies, 64, copied) != 0) {
    g->copies = NULL;
    ok = 0;
  }
  char* copy = g != NULL ? g->copies : NULL;
  for (int i = 0; ok && i < r->n_inputs; i++) {
    const KsInput* in = &r->inputs[i];
    TRITONSERVER_DataType t = numeric_type(in->datatype);
    const void* bytes = r->raw[i].p;
    if ((uintptr_t)bytes % dtype_size(t)) {
      memcpy(copy, bytes, r->raw[i].n);
      bytes = copy;
      copy += (r->raw[i].n + 63) & ~(size_t)63;
    }
    InputDesc desc = {.name = TEXT(in->name),
                      .dtype = t,
                      .ndim = (uint32_t)in->ndim,
                      .shape = in->shape,
                      .data = bytes,
                      .nbytes = r->raw[i].n}; /* (host memory) */
    ok = desc.name != NULL && fine(request_add_inputs(req, &desc, 1));
  }
  for (int i = 0; ok && i < r->n_outputs; i++) {
    int again = 0; /* an output named twice is asked for once (kserve.requested_outputs) */
    for (int j = 0; j < i; j++) again |= slice_eq(r->outputs[i], r->outputs[j]);
    const char* name = again ? NULL : TEXT(r->outputs[i]);
    ok = again ||
         (name != NULL && fine(api.TRITONSERVER_InferenceRequestAddRequestedOutput(req, name)));
  }
  if (ok && r->id.n) {
    const char* id = TEXT(r->id);
    ok = id != NULL && fine(api.TRITONSERVER_InferenceRequestSetId(req, id));
  }
#undef TEXT
  return ok;
}

/* With servers_lock held (read): the request to Triton, built from r, answered on call. Returns
 * the call, or NULL when it is declined (nothing left behind). */
static KsCall* ks_submit(TRITONSERVER_Server* server, const char* model, long long version,
                         const KsRequest* r, PyObject* call, PyObject* data, const CallOps* ops,
                         const KsCall* http, int moved)
{
  TRITONSERVER_InferenceRequest* req = NULL;
  if (!fine(api.TRITONSERVER_InferenceRequestNew(&req, server, model, version))) return NULL;
  KsCall* g = calloc(1, sizeof(KsCall));
  int ok = ks_build(req, r, g);
  Call* c = ok ? &g->c : NULL;
  if (ok) {
    c->server = server;
    c->request = req;
    c->out_device = -1; /* (outputs in Triton's host buffers: the allocator needs no call) */
    ok = fine(call_bind_request(c));
  }
  if (!ok) { /* the Python path words what went wrong */
    api.TRITONSERVER_InferenceRequestDelete(req);
    if (g != NULL) free(g->copies);
    free(g);
    return NULL;
  }
  c->keep = c->keep_inline;
  /* moved: the caller's references to data and call are the call's now (it may have no GIL) */
  c->keep[c->n_keep++] = moved ? data : Py_NewRef(data);
  g->call = moved ? call : Py_NewRef(call);
  g->model = r->model;
  g->version = r->version;
  g->id = r->id;
  if (http != NULL) { /* (owned by the call from here on) */
    g->values = http->values;
    g->answer = http->answer;
    g->outputs = http->outputs;
  }
  call_set_ops(c, ops);
  /* the caller's (dropped once it answered), Triton's two, the cancel handle's */
  atomic_init(&c->refs, 4);
  held_add(c);
  atomic_fetch_add(&in_flight, 1);
  /* With the GIL, as submit() hands over an asynchronous call: letting it go for the hand-over,
   * which does not block, would let the model thread in and leave the IO thread queueing for
   * the GIL behind it at each request (a convoy under load). (A model with a batch rule, whose
   * batcher calls Python, is not taken.) */
  TRITONSERVER_Error* err = hand_over(server, req, NULL);
  if (!fine(err)) { /* not taken: no callbacks; the Python path says why */
    held_release(c);
    call_claim(c);
    api.TRITONSERVER_InferenceRequestDelete(req);
    if (moved) { /* (the caller's again) */
      c->n_keep = 0;
    } else {
      call_drop_inputs(c);
      Py_DECREF(call);
    }
    free(g->copies);
    free(g); /* (its values and outputs are the caller's again) */
    return NULL;
  }
  return g;
}

/* The table's entry for key, (model, version) (see grpc_model_infer): ENTRY_TAKEN with *version
 * and *server set for a model the C path may take, ENTRY_DECLINED for one it may not,
 * ENTRY_MISSING when Python must make the entry first (none, or its binding changed), -1 with an
 * exception. */
int ks_entry(PyObject* table, PyObject* bound_models, PyObject* key, PyObject* server_arg,
             long long* version, TRITONSERVER_Server** server)
{
  PyObject* entry = PyDict_GetItemWithError(table, key);
  PyObject* bound =
      entry != NULL ? PyDict_GetItemWithError(bound_models, PyTuple_GET_ITEM(key, 0)) : NULL;
  if (PyErr_Occurred()) return -1;
  if (bound == NULL) bound = Py_None; /* (not bound: the entry says None) */
  if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2 ||
      bound != PyTuple_GET_ITEM(entry, 0))
    return ENTRY_MISSING;
  if (PyTuple_GET_ITEM(entry, 1) == Py_None) return ENTRY_DECLINED;
  *version = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 1));
  *server = (TRITONSERVER_Server*)PyLong_AsVoidPtr(server_arg);
  return PyErr_Occurred() ? -1 : ENTRY_TAKEN;
}

/* ks_submit to a server that is open, for a model without a queue gate (whose requests the
 * Python path queues): the call, or NULL when declined. */
KsCall* ks_submit_open(TRITONSERVER_Server* server, const char* model, long long version,
                       const KsRequest* r, PyObject* call, PyObject* data, const CallOps* ops,
                       const KsCall* http, int moved)
{
  pthread_rwlock_rdlock(&servers_lock);
  Gate* gate = server_is_open(server) ? gate_find(server, model, version) : NULL;
  KsCall* g = NULL;
  if (server_is_open(server) && gate == NULL)
    g = ks_submit(server, model, version, r, call, data, ops, http, moved);
  pthread_rwlock_unlock(&servers_lock);
  if (gate != NULL) gate_release_ref(gate);
  return g;
}

/* release_answered() -> n: let go of the calls both C paths answered since the last gRPC or HTTP
 * request took one (their _h2 calls and messages), as an endpoint stops; how many. */
PyObject* py_release_answered(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  return PyLong_FromSsize_t(ks_release());
}
