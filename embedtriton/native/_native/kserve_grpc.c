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
 * Triton takes. The protobuf subset is kserve_pb.c's; the call's hand-over is kserve.c's. */
#include "kserve_grpc.h"

#include "calls.h"
#include "complete.h"
#include "graveyard.h"
#include "kserve.h"
#include "kserve_json.h"
#include "kserve_pb.h"

static atomic_llong n_taken, n_declined;

/* Triton's final response completed the call (its thread, no GIL): answer it. */
static void grpc_finish(Call* c)
{
  KsCall* g = (KsCall*)c;
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
    message = ks_encode(ks_h2, g->model, g->version, g->id, resp, &e);
  }
  ks_h2->reply(g->call, message, message != NULL ? 0 : ks_status(e.code, 0), message ? "" : e.text);
  ks_after_answer(c);
}

/* With the GIL: stop() completed the call (claimed) before Triton did. */
static void grpc_wake(Call* c)
{
  KsCall* g = (KsCall*)c;
  ks_h2->reply(g->call, NULL, 14, "the server stopped before this request completed");
  Py_CLEAR(g->call);
  call_unref(c);
}

static const CallOps grpc_ops = {.response = call_one_response,
                                 .finish = grpc_finish,
                                 .wake = grpc_wake,
                                 .destroy = ks_destroy,
                                 .free_later = 1};

static void handle_free(PyObject* capsule)
{
  Call* c = (Call*)PyCapsule_GetPointer(capsule, "embedtriton.request");
  if (c != NULL) call_unref(c);
}

/* A call taken: its cancel handle for the caller (as submit() hands over an asynchronous call). */
static PyObject* handle_of(KsCall* g)
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
  ks_release();
  PyObject *call = args[0], *data = args[1], *server_arg = args[4];
  KjRequest* space = scratch();
  KsRequest* r = space != NULL ? &space->r : NULL;
  PyObject *key = NULL, *result = Py_None;
  if (r == NULL || !api_loaded || server_arg == Py_None || ks_load_h2() < 0 ||
      !PyObject_TypeCheck(call, ks_h2->call_type) ||
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
  KsCall* g = ks_submit_open(server, model, version, r, call, data, &grpc_ops, NULL, 0);
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

/* grpc_stats() -> (taken, declined): ModelInfer calls grpc_model_infer took and declined. */
PyObject* py_grpc_stats(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  return Py_BuildValue("(LL)", (long long)atomic_load(&n_taken),
                       (long long)atomic_load(&n_declined));
}
