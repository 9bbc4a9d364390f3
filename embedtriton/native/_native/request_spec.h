/* request_spec.c: one request as Python gives it, read (RequestSpec). */
#ifndef EMBEDTRITON_REQUEST_SPEC_H
#define EMBEDTRITON_REQUEST_SPEC_H

#include "common.h"

#define NOT_RUNNING "the server is not running; call start() or use 'with server:'"

/* One request as submit() and submit_many() read it: where it goes (target_args) and the
 * fields of its InferRequest (embedtriton/core/request.py), read once by request_spec_read.
 * The common case costs nothing; other mappings and sequences are converted. Item checks
 * (input arrays, output names and buffers, parameter values, the correlation id) are made
 * as submit_locked hands them to Triton. */
typedef struct RequestSpec {
  TRITONSERVER_Server* server;
  const char* model; /* (the caller's str, borrowed) */
  long long version;
  PyObject* inputs;     /* a dict name -> array */
  PyObject* outputs;    /* None, a tuple of names or a dict name -> buffer */
  PyObject* request_id; /* None or a str that text_of takes */
  unsigned long long priority, timeout_us;
  PyObject* parameters; /* None or a dict */
  PyObject* sequence;   /* None or (correlation id, TRITONSERVER_RequestFlag bits) */
  PyObject* trace_sink; /* None or the callable that takes the request's timestamps */
  int out_device;       /* the GPU that outputs go to; -1: host memory */
} RequestSpec;

/* (server, model, version) from args[0..2]: -1 with UnavailableError when the server is
 * not running (a bad model or version leaves a Python error for the caller). */
int target_args(PyObject* const* args, RequestSpec* s);
/* The request's fields into s (references, which request_spec_clear drops; the target is
 * left as it is). -1 with an InvalidArgumentError "<option> must be <takes>, not ...",
 * and nothing held. */
int request_spec_read(PyObject* request, RequestSpec* s);
void request_spec_clear(RequestSpec* s);
/* An unsigned 64-bit option (priority, timeout_us, a correlation id): None is 0; an int (not a
 * bool) or an object with __index__ (numpy integers) in range. -1 with an InvalidArgumentError
 * "<option> must be <takes>, not ...". */
int u64_option(PyObject* value, const char* option, const char* takes, unsigned long long* out);

#endif
