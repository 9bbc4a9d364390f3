/* kserve.c: what the C paths of the KServe endpoints (kserve_grpc.c, kserve_http.c) share: the
 * call, its hand-over to Triton, the models' table, the calls answered. */
#ifndef EMBEDTRITON_KSERVE_H
#define EMBEDTRITON_KSERVE_H

#include "calls.h"
#include "kserve_json.h"
#include "kserve_pb.h"

#include "h2_reply.h"

/* A call of either C path: the Call, then what its answer needs. */
typedef struct KsCall {
  Call c;                   /* first: the Call is freed as a whole (calls.c) */
  PyObject* call;           /* the _h2 call the answer goes to (a reference, until then) */
  Slice model, version, id; /* in the message (c.keep[0]; HTTP: the URL's str in c.keep) */
  void* copies;             /* inputs not aligned in the message, copied */
  struct KsCall* answered_next;
  /* HTTP: the JSON inputs' values, and what the answer needs of the request */
  void* values;
  KjAnswer answer;
  Slice* outputs; /* answer.outputs: the names asked for (in the body) */
} KsCall;

/* _h2's reply interface (ks_load_h2). */
extern const H2Reply* ks_h2;
/* 0 once ks_h2 is loaded; -1 (no exception) while _h2 is not importable. */
int ks_load_h2(void);

/* This thread's decoding space, or NULL when out of memory. */
KjRequest* scratch(void);
/* The status a transport answers a Triton error code with: gRPC's, or (http) HTTP's. */
int ks_status(int code, int http);
/* A Triton error message without its "[request id: ...] " prefix (error_for_code). */
const char* without_request_id(const char* m);

/* With the GIL: let go of what answered calls hold, and free those that are done. */
Py_ssize_t ks_release(void);
/* After the answer (Triton's thread, no GIL): Triton's response goes, and the call waits for
 * the next ks_release. */
void ks_after_answer(Call* c);
/* With the GIL (call_free_later): the message Triton read from, and copies of it. */
void ks_destroy(Call* c);

enum { ENTRY_DECLINED = 0, ENTRY_TAKEN = 1, ENTRY_MISSING = 2 };
int ks_entry(PyObject* table, PyObject* bound_models, PyObject* key, PyObject* server_arg,
             long long* version, TRITONSERVER_Server** server);
KsCall* ks_submit_open(TRITONSERVER_Server* server, const char* model, long long version,
                       const KsRequest* r, PyObject* call, PyObject* data, const CallOps* ops,
                       const KsCall* http, int moved);
PyObject* py_release_answered(PyObject* self, PyObject* unused);

#endif
