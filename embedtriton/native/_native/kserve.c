/* A unary gRPC ModelInfer answered in C: the ModelInferRequest protobuf decoded
 * straight into a Triton request (inputs point into the received message, no
 * copy, where they are aligned for their datatype) and handed to Triton; the
 * ModelInferResponse is encoded from Triton's output buffers on Triton's thread
 * and handed to the _h2 stream through its C interface (h2_reply.h), without
 * the GIL: no Python on the completion path.
 *
 * grpc_model_infer() takes only plain requests and declines the rest (None): the Python
 * path (frontends/grpc/infer.py) then runs as before and words any error. Plain:
 * well-formed protobuf in the subset below; ASCII strings without NUL (names and the id at
 * most 255 characters); no tensor parameters; no request parameters but one that a unary
 * call ignores; raw contents only (no typed contents); numeric datatypes; at most MAX_DIMS
 * non-negative dimensions; no empty batch; distinct input names; each input's raw bytes
 * exactly filling its shape; a model that Python's table admits (a bound model, not
 * decoupled, no optional inputs, no batch rule) with no queue gate; and a request that
 * Triton takes. The protobuf subset is kserve_pb.c's. */
#include "kserve.h"

#include "calls.h"
#include "cancel.h"
#include "complete.h"
#include "gates.h"
#include "graveyard.h"
#include "kserve_json.h"
#include "kserve_pb.h"
#include "outputs.h"
#include "servers.h"
#include "threads.h"

#include "h2_reply.h"

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
static KjRequest* scratch(void)
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

/* ---- the call ------------------------------------------------------------ */

/* Triton's error codes as gRPC status codes (frontends/statuses.py, test_statuses.py). */
static int grpc_code(int code)
{
  static const int codes[] = {13, 13, 5, 3, 14, 12, 6, 1};
  return code >= 0 && code < (int)(sizeof codes / sizeof codes[0]) ? codes[code] : 13;
}

/* A Triton error message without its "[request id: ...] " prefix (error_for_code). */
static const char* without_request_id(const char* m)
{
  if (strncmp(m, "[request id: ", 13) == 0) {
    const char* end = strstr(m, "] ");
    if (end != NULL && end > m) return end + 2;
  }
  return m;
}

typedef struct GrpcCall {
  Call c;                   /* first: the Call is freed as a whole (calls.c) */
  PyObject* call;           /* the _h2 call (c.future holds the reference) */
  Slice model, version, id; /* in the message (c.keep[0]; HTTP: the URL's str in c.keep) */
  void* copies;             /* inputs not aligned in the message, copied */
  struct GrpcCall* answered_next;
  /* HTTP: the JSON inputs' values, and what the answer needs of the request */
  void* values;
  KjAnswer answer;
  Slice* outputs; /* answer.outputs: the names asked for (in the body) */
} GrpcCall;

static const H2Reply* h2 = NULL;
static atomic_llong n_taken, n_declined, n_http_taken, n_http_declined;

/* Calls answered on Triton's threads: their _h2 call (which holds the cancel handle, which holds
 * the call) and the caller's reference are let go of by the next grpc_release, with the GIL. */
static _Atomic(GrpcCall*) answered = NULL;

/* With the GIL: let go of what answered calls hold, and free those that are done. */
static void grpc_release(void)
{
  GrpcCall* g = atomic_load_explicit(&answered, memory_order_relaxed)
                    ? atomic_exchange(&answered, NULL)
                    : NULL;
  while (g != NULL) {
    GrpcCall* next = g->answered_next;
    Py_CLEAR(g->c.future);
    call_unref(&g->c); /* the caller's */
    g = next;
  }
  call_free_later();
}

static void after_answer(Call* c);

/* Triton's final response completed the call (its thread, no GIL): answer it. */
static void grpc_finish(Call* c)
{
  GrpcCall* g = (GrpcCall*)c;
  TRITONSERVER_InferenceResponse* resp = atomic_load(&c->response);
  TRITONSERVER_Error* err = resp != NULL ? api.TRITONSERVER_InferenceResponseError(resp) : NULL;
  void* message = NULL;
  KsError e = {0, ""};
  if (resp == NULL) {
    e = (KsError){TRITONSERVER_ERROR_INTERNAL, "Triton completed the request without a response"};
  } else if (err != NULL) {
    e = (KsError){api.TRITONSERVER_ErrorCode(err),
                  without_request_id(api.TRITONSERVER_ErrorMessage(err))};
  } else {
    message = ks_encode(h2, g->model, g->version, g->id, resp, &e);
  }
  h2->reply(g->call, message, message != NULL ? 0 : grpc_code(e.code), message ? "" : e.text);
  after_answer(c);
}

/* After the answer (Triton's thread, no GIL): Triton's response goes, and the call waits for
 * the next grpc_release. */
static void after_answer(Call* c)
{
  GrpcCall* g = (GrpcCall*)c;
  TRITONSERVER_InferenceResponse* resp = atomic_exchange(&c->response, NULL);
  if (resp != NULL && t_sending) /* our backend's send: on the thread that made it (outputs.c) */
    delete_sent(resp);
  else if (resp != NULL) bury(NULL, resp); /* (its model may go once Triton deleted it) */
  g->answered_next = atomic_load(&answered);
  while (!atomic_compare_exchange_weak(&answered, &g->answered_next, g)) {
  }
}

/* With the GIL: stop() completed the call (claimed) before Triton did. */
static void grpc_wake(Call* c)
{
  h2->reply(((GrpcCall*)c)->call, NULL, 14, "the server stopped before this request completed");
  Py_CLEAR(c->future);
  call_unref(c);
}

/* With the GIL (call_free_later): the message Triton read from, and copies of it. */
static void grpc_destroy(Call* c)
{
  GrpcCall* g = (GrpcCall*)c;
  call_drop_inputs(c);
  free(g->copies);
  free(g->values);
  free(g->outputs);
}

static const CallOps grpc_ops = {.response = call_one_response,
                                 .finish = grpc_finish,
                                 .wake = grpc_wake,
                                 .destroy = grpc_destroy,
                                 .free_later = 1};

/* Triton's HTTP status of an error code (frontends/statuses.py; tests/unit/test_statuses.py). */
static int http_status(int code)
{
  static const int statuses[] = {400, 500, 404, 400, 503, 501, 400, 400};
  return code >= 0 && code < (int)(sizeof statuses / sizeof statuses[0]) ? statuses[code] : 400;
}

/* (http_reply takes the call's reference over: c->future's, cleared by the caller) */
static void http_error(PyObject* call, int code, const char* text)
{
  size_t len = 0;
  char* body = kj_error(text, &len);
  if (body == NULL) { /* (out of memory: no words) */
    h2->http_reply(call, 503, "Content-Type: application/json\r\n", "{}", 2);
    return;
  }
  h2->http_reply(call, http_status(code), "Content-Type: application/json\r\n", body, len);
  free(body);
}

/* Triton's final response completed an HTTP call (its thread, no GIL): answer it. */
static void http_finish(Call* c)
{
  GrpcCall* g = (GrpcCall*)c;
  TRITONSERVER_InferenceResponse* resp = atomic_load(&c->response);
  TRITONSERVER_Error* err = resp != NULL ? api.TRITONSERVER_InferenceResponseError(resp) : NULL;
  KsError e = {0, ""};
  char* body = NULL;
  size_t len = 0, header_len = 0;
  c->future = NULL; /* (its reference goes to http_reply, which releases it on the IO thread) */
  if (resp == NULL) {
    e = (KsError){TRITONSERVER_ERROR_INTERNAL, "Triton completed the request without a response"};
  } else if (err != NULL) {
    e = (KsError){api.TRITONSERVER_ErrorCode(err),
                  without_request_id(api.TRITONSERVER_ErrorMessage(err))};
  } else {
    body = kj_encode(&g->answer, resp, &len, &header_len, &e);
  }
  if (body != NULL && header_len) {
    char fields[128];
    snprintf(fields, sizeof fields,
             "Content-Type: application/octet-stream\r\nInference-Header-Content-Length: %zu\r\n",
             header_len);
    h2->http_reply(g->call, 200, fields, body, len);
  } else if (body != NULL) {
    h2->http_reply(g->call, 200, "Content-Type: application/json\r\n", body, len);
  } else {
    http_error(g->call, e.code, e.text);
  }
  free(body);
  after_answer(c);
}

/* With the GIL: stop() completed the call (claimed) before Triton did. */
static void http_wake(Call* c)
{
  c->future = NULL; /* (its reference goes to http_reply) */
  http_error(((GrpcCall*)c)->call, TRITONSERVER_ERROR_UNAVAILABLE,
             "the server stopped before this request completed");
  call_unref(c);
}

static const CallOps http_ops = {.response = call_one_response,
                                 .finish = http_finish,
                                 .wake = http_wake,
                                 .destroy = grpc_destroy,
                                 .free_later = 1};

static void handle_free(PyObject* capsule)
{
  Call* c = (Call*)PyCapsule_GetPointer(capsule, "embedtriton.request");
  if (c != NULL) call_unref(c);
}

static int load_h2(void)
{
  if (h2 == NULL) {
    h2 = PyCapsule_Import(H2_REPLY_CAPSULE, 0);
    if (h2 == NULL) PyErr_Clear();
  }
  return h2 != NULL ? 0 : -1;
}

/* Whether a Triton call succeeded (its error dropped). */
static int fine(TRITONSERVER_Error* err)
{
  if (err != NULL) api.TRITONSERVER_ErrorDelete(err);
  return err == NULL;
}

/* With servers_lock held (read): the request to Triton, built from r, answered on call. Returns
 * the call, or NULL when it is declined (nothing left behind). */
static GrpcCall* ks_submit(TRITONSERVER_Server* server, const char* model, long long version,
                           const KsRequest* r, PyObject* call, PyObject* data, const CallOps* ops,
                           const GrpcCall* http, int moved)
{
  char text[256]; /* one name at a time, NUL-terminated for Triton (which copies it) */
#define TEXT(s) (s.n < sizeof text ? (memcpy(text, s.p, s.n), text[s.n] = 0, text) : NULL)
  TRITONSERVER_InferenceRequest* req = NULL;
  if (!fine(api.TRITONSERVER_InferenceRequestNew(&req, server, model, version))) return NULL;
  GrpcCall* g = calloc(1, sizeof(GrpcCall));
  int ok = g != NULL;
  /* Inputs point into the message. One whose bytes are not aligned there for its datatype is
   * copied (into one block for all of them): the model's arrays are aligned, as they are on the
   * Python path, where protobuf copies each raw content into a bytes object of its own. */
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
    const char* name = TEXT(in->name);
    ok = name != NULL &&
         fine(api.TRITONSERVER_InferenceRequestAddInput(req, name, t, in->shape,
                                                        (uint64_t)in->ndim)) &&
         fine(api.TRITONSERVER_InferenceRequestAppendInputData(req, name, bytes, r->raw[i].n,
                                                               TRITONSERVER_MEMORY_CPU, 0));
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
  Call* c = ok ? &g->c : NULL;
  ok = ok && fine(api.TRITONSERVER_InferenceRequestSetReleaseCallback(req, release_cb, c)) &&
       fine(api.TRITONSERVER_InferenceRequestSetResponseCallback(req, allocator, NULL, response_cb,
                                                                 c));
  if (!ok) { /* the Python path words what went wrong */
    api.TRITONSERVER_InferenceRequestDelete(req);
    if (g != NULL) free(g->copies);
    free(g);
    return NULL;
  }
  c->server = server;
  c->request = req;
  c->out_device = -1;
  c->keep = c->keep_inline;
  /* moved: the caller's references to data and call are the call's now (it may have no GIL) */
  c->keep[c->n_keep++] = moved ? data : Py_NewRef(data);
  c->future = moved ? call : Py_NewRef(call);
  g->call = call;
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
      c->future = NULL;
    } else {
      call_drop_inputs(c);
      Py_CLEAR(c->future);
    }
    free(g->copies);
    free(g); /* (its values and outputs are the caller's again) */
    return NULL;
  }
  return g;
}

enum { ENTRY_DECLINED = 0, ENTRY_TAKEN = 1, ENTRY_MISSING = 2 };

/* The table's entry for key, (model, version) (see grpc_model_infer): ENTRY_TAKEN with *version
 * and *server set for a model the C path may take, ENTRY_DECLINED for one it may not,
 * ENTRY_MISSING when Python must make the entry first (none, or its binding changed), -1 with an
 * exception. */
static int ks_entry(PyObject* table, PyObject* bound_models, PyObject* key, PyObject* server_arg,
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
static GrpcCall* ks_submit_open(TRITONSERVER_Server* server, const char* model, long long version,
                                const KsRequest* r, PyObject* call, PyObject* data,
                                const CallOps* ops, const GrpcCall* http, int moved)
{
  pthread_rwlock_rdlock(&servers_lock);
  Gate* gate = server_is_open(server) ? gate_find(server, model, version) : NULL;
  GrpcCall* g = NULL;
  if (server_is_open(server) && gate == NULL)
    g = ks_submit(server, model, version, r, call, data, ops, http, moved);
  pthread_rwlock_unlock(&servers_lock);
  if (gate != NULL) gate_release_ref(gate);
  return g;
}

/* A call taken: its cancel handle for the caller (as submit() hands over an asynchronous call). */
static PyObject* handle_of(GrpcCall* g)
{
  delete_buried(GRAVE_STEP_ASYNC);
  PyObject* handle = PyCapsule_New(&g->c, "embedtriton.request", handle_free);
  if (handle == NULL) call_unref(&g->c);
  return handle;
}

/* grpc_model_infer(call, data, table, bound, server): see the top of this file. table maps
 * (model_name, model_version) to (binding, version) for a model the C path may take, version
 * None for one it may not; bound is the server's name -> binding (an entry holds while its
 * binding is still the bound one). Returns the cancel handle of a call taken; None for one
 * declined; (model_name, model_version) when the table has no valid entry for them. */
PyObject* py_grpc_model_infer(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
  (void)self;
  if (nargs != 5 || !PyBytes_Check(args[1]) || !PyDict_Check(args[2]) || !PyDict_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "grpc_model_infer(call, data: bytes, table, bound, server)");
    return NULL;
  }
  grpc_release();
  PyObject *call = args[0], *data = args[1], *server_arg = args[4];
  KjRequest* space = scratch();
  KsRequest* r = space != NULL ? &space->r : NULL;
  PyObject *key = NULL, *result = Py_None;
  if (r == NULL || !api_loaded || server_arg == Py_None || load_h2() < 0 ||
      !PyObject_TypeCheck(call, h2->call_type) ||
      ks_decode((const uint8_t*)PyBytes_AS_STRING(data), (size_t)PyBytes_GET_SIZE(data), r) < 0 ||
      ks_plain(r) < 0)
    goto decline;
  key = Py_BuildValue("(s#s#)", (const char*)r->model.p, (Py_ssize_t)r->model.n,
                      (const char*)r->version.p, (Py_ssize_t)r->version.n);
  long long version;
  TRITONSERVER_Server* server;
  int found = key != NULL ? ks_entry(args[2], args[3], key, server_arg, &version, &server) : -1;
  if (found == ENTRY_MISSING) {
    result = key; /* Python decides, and calls again */
    key = NULL;
    goto done;
  }
  if (found < 0) goto fail;
  if (found == ENTRY_DECLINED) goto decline;
  const char* model = PyUnicode_AsUTF8(PyTuple_GET_ITEM(key, 0));
  if (model == NULL) goto fail;
  GrpcCall* g = ks_submit_open(server, model, version, r, call, data, &grpc_ops, NULL, 0);
  if (g == NULL) goto decline;
  atomic_fetch_add(&n_taken, 1);
  result = handle_of(g);
  goto done;
decline:
  atomic_fetch_add(&n_declined, 1);
  result = Py_NewRef(Py_None);
  goto done;
fail:
  result = NULL;
done:
  Py_XDECREF(key);
  return result;
}

/* ---- HTTP/REST inference: the IO thread's two steps (h2_reply.h, H1FastOps) ----
 * An HTTP/REST inference request (its body; the URL's model and version; header_len:
 * Inference-Header-Content-Length, -1 without one) decoded (kserve_json.c), handed to Triton and
 * answered in C, with grpc_model_infer's table. prepare(), with the GIL, finds the model's entry
 * and makes and holds the Python objects; submit(), without it, decodes and hands the request
 * over, so that the model thread runs while the IO thread hands a batch of requests over. */

/* What a taken request's on_gone cancels: its call, once submit() took it. (A capsule's.) */
typedef struct {
  Call* c; /* the cancel handle's reference, from submit() on */
} CancelSlot;

static void slot_free(PyObject* capsule)
{
  CancelSlot* slot = PyCapsule_GetPointer(capsule, "embedtriton.http_request");
  if (slot != NULL && slot->c != NULL) call_unref(slot->c);
  free(slot);
}

/* The HTTP call's on_gone for a request taken: its client left, so it is cancelled in Triton. */
static PyObject* cancel_taken(PyObject* capsule, PyObject* unused)
{
  (void)unused;
  CancelSlot* slot = PyCapsule_GetPointer(capsule, "embedtriton.http_request");
  if (slot == NULL) return NULL;
  if (slot->c != NULL) call_cancel(slot->c);
  Py_RETURN_NONE;
}

static PyMethodDef cancel_taken_def = {"cancel", cancel_taken, METH_NOARGS, NULL};

typedef struct {
  PyObject *call, *body, *name, *vers; /* references, the call's once taken */
  const char *model, *version_text;    /* (UTF-8 of name and vers) */
  Py_ssize_t model_n, version_n;
  long long number, header_len;
  TRITONSERVER_Server* server;
  CancelSlot* slot;
} HttpState;

/* A URL segment as text: NULL (no exception) unless plain printable ASCII, no escapes */
static PyObject* url_text(const char* p, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (p[i] < 0x20 || p[i] > 0x7e || p[i] == '%' || p[i] == '?' || p[i] == '/') return NULL;
  return PyUnicode_FromStringAndSize(p, (Py_ssize_t)n);
}

/* The table's entry for (name, vers): ENTRY_* as ks_entry, after admit() when it has none yet. */
static int http_entry(PyObject* ctx, PyObject* name, PyObject* vers, long long* number,
                      TRITONSERVER_Server** server)
{
  PyObject* key = PyTuple_Pack(2, name, vers);
  if (key == NULL) return -1;
  PyObject *table = PyTuple_GET_ITEM(ctx, 0), *bound = PyTuple_GET_ITEM(ctx, 1),
           *server_arg = PyTuple_GET_ITEM(ctx, 2);
  int found = server_arg == Py_None ? ENTRY_DECLINED
                                    : ks_entry(table, bound, key, server_arg, number, server);
  if (found == ENTRY_MISSING) { /* no entry for the model yet: admit(), then again */
    PyObject* made = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(ctx, 3), name, vers, NULL);
    found = made != NULL ? ks_entry(table, bound, key, server_arg, number, server) : -1;
    Py_XDECREF(made);
    if (found == ENTRY_MISSING) found = ENTRY_DECLINED; /* (its binding changed meanwhile) */
  }
  Py_DECREF(key);
  return found;
}

static void state_free(HttpState* st)
{
  Py_XDECREF(st->call);
  Py_XDECREF(st->body);
  Py_XDECREF(st->name);
  Py_XDECREF(st->vers);
  free(st);
}

/* prepare (GIL), for a POST to /v2/models/ that asks for no compression. ctx: (table, bound,
 * server, admit), where admit(model, version) makes the table's entry. The URL's path is
 * /v2/models/<model>[/versions/<version>]/infer exactly: no query, no escapes. */
static void* http_prepare(PyObject* call, const char* url, size_t url_len, const uint8_t* data,
                          size_t data_len, long long header_len, PyObject* ctx)
{
  grpc_release();
  if (!PyTuple_Check(ctx) || PyTuple_GET_SIZE(ctx) != 4 || url_len < 11 ||
      memcmp(url, "/v2/models/", 11) != 0)
    return NULL;
  const char *segs[6], *end = url + url_len;
  size_t lens[6];
  int n = 0;
  for (const char* p = url + 1; n < 6;) { /* (url starts "/v2/models/") */
    const char* slash = memchr(p, '/', (size_t)(end - p));
    const char* stop = slash != NULL ? slash : end;
    segs[n] = p, lens[n++] = (size_t)(stop - p);
    if (slash == NULL) break;
    p = slash + 1;
  }
  int versioned = n == 6 && lens[3] == 8 && memcmp(segs[3], "versions", 8) == 0;
  if (!(n == 4 || versioned) || lens[n - 1] != 5 || memcmp(segs[n - 1], "infer", 5) != 0 ||
      (segs[n - 1] + 5 != end))
    return NULL;
  if (!api_loaded || load_h2() < 0 || !PyObject_TypeCheck(call, h2->http_call_type)) {
    PyErr_Clear();
    return NULL;
  }
  HttpState* st = calloc(1, sizeof *st);
  if (st == NULL) return NULL;
  st->header_len = header_len;
  st->name = url_text(segs[2], lens[2]);
  st->vers = st->name == NULL ? NULL
             : versioned      ? url_text(segs[4], lens[4])
                              : PyUnicode_FromStringAndSize("", 0);
  int found = st->vers != NULL ? http_entry(ctx, st->name, st->vers, &st->number, &st->server) : -1;
  if (found == ENTRY_TAKEN) {
    st->model = PyUnicode_AsUTF8AndSize(st->name, &st->model_n);
    st->version_text = PyUnicode_AsUTF8AndSize(st->vers, &st->version_n);
    st->body = PyBytes_FromStringAndSize((const char*)data, (Py_ssize_t)data_len);
    st->slot = calloc(1, sizeof *st->slot);
  }
  PyObject* capsule = found == ENTRY_TAKEN && st->model && st->version_text && st->body && st->slot
                          ? PyCapsule_New(st->slot, "embedtriton.http_request", slot_free)
                          : NULL;
  if (capsule == NULL) free(st->slot); /* (the capsule owns it from here on) */
  /* a client that leaves cancels it (once submit() took it): the call holds the capsule */
  PyObject* cancel = capsule != NULL ? PyCFunction_New(&cancel_taken_def, capsule) : NULL;
  Py_XDECREF(capsule);
  int ok = cancel != NULL && h2->http_on_gone(call, cancel) == 0;
  Py_XDECREF(cancel);
  if (!ok) { /* (not in the table, or admit() raised, or out of memory): the Python path's */
    if (PyErr_Occurred()) PyErr_WriteUnraisable(PyTuple_GET_ITEM(ctx, 3));
    if (found == ENTRY_DECLINED) atomic_fetch_add(&n_http_declined, 1);
    state_free(st);
    return NULL;
  }
  st->call = Py_NewRef(call);
  return st;
}

/* submit (no GIL, the thread that prepared it): decoded and handed to Triton, or declined. */
static int http_submit(void* state)
{
  HttpState* st = state;
  GrpcCall http = {0};
  KjRequest* q = scratch();
  if (q == NULL || kj_decode((const uint8_t*)PyBytes_AS_STRING(st->body),
                             (size_t)PyBytes_GET_SIZE(st->body), st->header_len, q) < 0)
    goto decline;
  http.values = q->values; /* (freed below unless the call takes it) */
  q->r.model = (Slice){(const uint8_t*)st->model, (size_t)st->model_n};
  q->r.version = (Slice){(const uint8_t*)st->version_text, (size_t)st->version_n};
  if (ks_plain(&q->r) < 0) goto decline;
  /* what the answer needs: the names asked for point into the body, which the call keeps */
  http.answer = (KjAnswer){.model = q->r.model,
                           .version = q->r.version,
                           .id = q->r.id,
                           .binary_default = q->binary_default,
                           .n_outputs = q->r.n_outputs};
  if (q->r.n_outputs) {
    http.outputs = malloc((size_t)q->r.n_outputs * sizeof(Slice));
    if (http.outputs == NULL) goto decline;
    memcpy(http.outputs, q->r.outputs, (size_t)q->r.n_outputs * sizeof(Slice));
    for (int k = 0; k < q->r.n_outputs; k++)
      http.answer.out_bits |= (uint64_t)(q->out_flag[k] != 0) << k;
    http.answer.outputs = http.outputs;
  }
  /* Counted before it is handed over: its answer may reach the client (written by Triton's
   * thread) before this thread runs again. */
  atomic_fetch_add(&n_http_taken, 1);
  GrpcCall* g = ks_submit_open(st->server, st->model, st->number, &q->r, st->call, st->body,
                               &http_ops, &http, 1);
  if (g == NULL) {
    atomic_fetch_sub(&n_http_taken, 1);
    goto decline;
  }
  /* taken: the references are the call's, the URL's names too (the answer writes them) */
  g->c.keep[g->c.n_keep++] = st->name;
  g->c.keep[g->c.n_keep++] = st->vers;
  st->slot->c = &g->c; /* (the cancel handle's reference) */
  free(st);
  delete_buried(GRAVE_STEP_ASYNC);
  return 1;
decline:
  atomic_fetch_add(&n_http_declined, 1);
  free(http.values);
  free(http.outputs);
  return 0;
}

/* abandon (GIL): submit() declined; the call's on_gone goes (the Python path sets its own). */
static void http_abandon(void* state)
{
  HttpState* st = state;
  if (h2->http_on_gone(st->call, Py_None) < 0) PyErr_WriteUnraisable(st->call);
  state_free(st);
}

static const H1FastOps http_fast_ops = {http_prepare, http_submit, http_abandon};

/* The capsule _h2's HttpServer.set_fast takes (embedtriton._native._HTTP_FAST). */
PyObject* http_fast_capsule(void)
{
  return PyCapsule_New((void*)&http_fast_ops, H1_FAST_CAPSULE, NULL);
}

/* grpc_release(): let go of the calls answered since the last grpc_model_infer (their _h2
 * calls and messages), e.g. as the endpoint stops. */
PyObject* py_grpc_release(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  grpc_release();
  Py_RETURN_NONE;
}

/* grpc_stats() -> (taken, declined): ModelInfer calls grpc_model_infer took and declined. */
PyObject* py_grpc_stats(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  return Py_BuildValue("(LL)", (long long)atomic_load(&n_taken),
                       (long long)atomic_load(&n_declined));
}

/* http_stats() -> (taken, declined): HTTP/REST inference requests the C path took and declined. */
PyObject* py_http_stats(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  return Py_BuildValue("(LL)", (long long)atomic_load(&n_http_taken),
                       (long long)atomic_load(&n_http_declined));
}
