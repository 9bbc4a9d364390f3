/* submit.c: submit() and cancel(): one request from Python, set up and handed to Triton. */
#ifndef EMBEDTRITON_SUBMIT_H
#define EMBEDTRITON_SUBMIT_H

#include "calls.h"

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
int lock_open_server(TRITONSERVER_Server* server);

/* How a request is submitted: its caller's side of the call. */
typedef struct Submission {
  PyObject* loop;   /* an asyncio caller's event loop, or None */
  PyObject* future; /* its future, a target, or a stream's wake-up; or None */
  int stream;       /* several responses, for a consumer */
  int release_gil;  /* a batch rule: the GIL is let go of for the hand-over */
  int cancellable;  /* an asynchronous caller gets a cancel handle */
  Group* group;     /* a call of submit_many, or NULL */
} Submission;

/* With servers_lock held (read), which it lets go of: one request to Triton. A call of a
 * group (submit_many) without a gate or batch rule is built, not handed over: *out, whose
 * gate_trace holds its trace until submit_many hands it over. */
PyObject* submit_locked(const RequestSpec* s, const Submission* how, Call** out);
/* With the GIL: Triton did not take c's request (err, deleted here): raises err, frees c. NULL. */
PyObject* submit_refused(Call* c, TRITONSERVER_Error* err, int handle_ref);
PyObject* py_cancel(PyObject* self, PyObject* capsule);
PyObject* py_submit(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

#endif
