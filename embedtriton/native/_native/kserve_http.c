/* An HTTP/REST inference request answered in C (the KServe-v2 JSON subset of kserve_json.c, with
 * the binary tensor data extension), in two steps on the IO thread (h2_reply.h's H1FastOps):
 * prepare() with the GIL, submit() without it. The call's hand-over is kserve.c's. */
#include "kserve_http.h"

#include "calls.h"
#include "cancel.h"
#include "complete.h"
#include "graveyard.h"
#include "kserve.h"
#include "kserve_json.h"
#include "kserve_pb.h"

static atomic_llong n_http_taken, n_http_declined;

/* (http_reply takes the reference to call over: the caller's KsCall no longer holds it) */
static void http_error(PyObject* call, int code, const char* text)
{
  size_t len = 0;
  char* body = kj_error(text, &len);
  if (body == NULL) { /* (out of memory: no words) */
    ks_h2->http_reply(call, 503, "Content-Type: application/json\r\n", "{}", 2);
    return;
  }
  ks_h2->http_reply(call, ks_status(code, 1), "Content-Type: application/json\r\n", body, len);
  free(body);
}

/* Triton's final response completed an HTTP call (its thread, no GIL): answer it. */
static void http_finish(Call* c)
{
  KsCall* g = (KsCall*)c;
  TRITONSERVER_InferenceResponse* resp = atomic_load(&c->response);
  TRITONSERVER_Error* err = resp != NULL ? api.TRITONSERVER_InferenceResponseError(resp) : NULL;
  KsError e = {0, ""};
  char* body = NULL;
  size_t len = 0, header_len = 0;
  PyObject* call = g->call; /* (its reference goes to http_reply, which lets go of it on the IO */
  g->call = NULL;           /* thread) */
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
    ks_h2->http_reply(call, 200, fields, body, len);
  } else if (body != NULL) {
    ks_h2->http_reply(call, 200, "Content-Type: application/json\r\n", body, len);
  } else {
    http_error(call, e.code, e.text);
  }
  free(body);
  ks_after_answer(c);
}

/* With the GIL: stop() completed the call (claimed) before Triton did. */
static void http_wake(Call* c)
{
  KsCall* g = (KsCall*)c;
  PyObject* call = g->call; /* (its reference goes to http_reply) */
  g->call = NULL;
  http_error(call, TRITONSERVER_ERROR_UNAVAILABLE,
             "the server stopped before this request completed");
  call_unref(c);
}

static const CallOps http_ops = {.response = call_one_response,
                                 .finish = http_finish,
                                 .wake = http_wake,
                                 .destroy = ks_destroy,
                                 .free_later = 1};

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
  ks_release();
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
  if (!api_loaded || ks_load_h2() < 0 || !PyObject_TypeCheck(call, ks_h2->http_call_type)) {
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
  int ok = cancel != NULL && ks_h2->http_on_gone(call, cancel) == 0;
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
  KsCall http = {0};
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
  KsCall* g = ks_submit_open(st->server, st->model, st->number, &q->r, st->call, st->body,
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
  if (ks_h2->http_on_gone(st->call, Py_None) < 0) PyErr_WriteUnraisable(st->call);
  state_free(st);
}

static const H1FastOps http_fast_ops = {http_prepare, http_submit, http_abandon};

/* The capsule _h2's HttpServer.set_fast takes (embedtriton._native._HTTP_FAST). */
PyObject* http_fast_capsule(void)
{
  return PyCapsule_New((void*)&http_fast_ops, H1_FAST_CAPSULE, NULL);
}

/* http_stats() -> (taken, declined): HTTP/REST inference requests the C path took and declined. */
PyObject* py_http_stats(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  return Py_BuildValue("(LL)", (long long)atomic_load(&n_http_taken),
                       (long long)atomic_load(&n_http_declined));
}
