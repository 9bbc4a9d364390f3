/* One request as Python gives it (embedtriton/core/request.py's InferRequest) read into a
 * RequestSpec, for submit() and submit_many(): its target (server, model, version) and its
 * options, each checked as the Python side words a refusal ("<option> must be <takes>, not
 * ..."). */
#include "request_spec.h"

#include "inputs.h"

/* dict(obj) for a mapping (new reference), or NULL with an InvalidArgumentError
 * "<option> must be <takes>, not ...". */
static PyObject* as_dict(PyObject* obj, const char* option, const char* takes)
{
  PyObject* d = PyMapping_Check(obj) && !PySequence_Check(obj)
                    ? PyObject_CallOneArg((PyObject*)&PyDict_Type, obj)
                    : NULL;
  if (d == NULL) {
    PyErr_Clear();
    refuse(option, takes, obj, "");
  }
  return d;
}

/* An unsigned 64-bit option (priority, timeout_us): None is 0; an int (not a bool) or an
 * object with __index__ (numpy integers) in range. -1 with an InvalidArgumentError. */
int u64_option(PyObject* value, const char* option, const char* takes, unsigned long long* out)
{
  *out = 0;
  if (value == Py_None) return 0;
  if (PyLong_CheckExact(value)) {
    *out = PyLong_AsUnsignedLongLong(value);
  } else if (!PyBool_Check(value) && PyIndex_Check(value)) {
    PyObject* n = PyNumber_Index(value);
    *out = n != NULL ? PyLong_AsUnsignedLongLong(n) : (unsigned long long)-1;
    Py_XDECREF(n);
  } else {
    *out = (unsigned long long)-1;
    PyErr_SetNone(PyExc_TypeError);
  }
  if (*out == (unsigned long long)-1 && PyErr_Occurred()) {
    refuse(option, takes, value, ""); /* (clears the error) */
    return -1;
  }
  return 0;
}

int target_args(PyObject* const* args, RequestSpec* s)
{
  if (!api_loaded || args[0] == Py_None) {
    raise_triton(TRITONSERVER_ERROR_UNAVAILABLE, NOT_RUNNING);
    return -1;
  }
  s->server = (TRITONSERVER_Server*)PyLong_AsVoidPtr(args[0]);
  s->model = PyUnicode_AsUTF8(args[1]);
  s->version = PyLong_AsLongLong(args[2]);
  return 0;
}

/* The InferRequest fields that request_spec_read reads, interned on first use. */
enum {
  F_INPUTS,
  F_OUTPUTS,
  F_REQUEST_ID,
  F_PRIORITY,
  F_TIMEOUT_US,
  F_PARAMETERS,
  F_SEQUENCE,
  F_OUTPUT_DEVICE,
  F_TRACE_SINK,
  N_FIELDS
};
static const char* const field_names[N_FIELDS] = {"inputs",   "outputs",       "request_id",
                                                  "priority", "timeout_us",    "parameters",
                                                  "sequence", "output_device", "trace_sink"};
static PyObject* fields[N_FIELDS];

/* outputs as the spec holds it (a new reference): None, a tuple or a dict as they are,
 * another sequence as a tuple. NULL with an InvalidArgumentError. */
static PyObject* outputs_of(PyObject* outputs)
{
  if (outputs == Py_None || PyTuple_Check(outputs) || PyDict_Check(outputs))
    return Py_NewRef(outputs);
  if (PyUnicode_Check(outputs)) { /* outputs="y": a slip for ["y"] */
    PyObject* got = shown(outputs);
    PyObject* hint = got != NULL ? PyUnicode_FromFormat(": for one output, pass [%U]", got) : NULL;
    const char* text = hint != NULL ? PyUnicode_AsUTF8(hint) : NULL;
    if (text != NULL) refuse("outputs", TAKES_OUTPUTS, outputs, text);
    Py_XDECREF(got);
    Py_XDECREF(hint);
    return NULL;
  }
  PyObject* names = NULL;
  if (PyBytes_Check(outputs) || PyByteArray_Check(outputs) ||
      (names = PySequence_Tuple(outputs)) == NULL) {
    PyErr_Clear();
    refuse("outputs", TAKES_OUTPUTS, outputs, "");
  }
  return names;
}

int request_spec_read(PyObject* request, RequestSpec* s)
{
  s->inputs = s->outputs = s->request_id = s->parameters = s->sequence = s->trace_sink = NULL;
  s->priority = s->timeout_us = 0;
  s->out_device = -1;
  if (PyDict_CheckExact(request)) { /* Model.infer without options: its inputs as they are */
    s->inputs = Py_NewRef(request);
    s->outputs = Py_NewRef(Py_None);
    s->request_id = Py_NewRef(Py_None);
    s->parameters = Py_NewRef(Py_None);
    s->sequence = Py_NewRef(Py_None);
    s->trace_sink = Py_NewRef(Py_None);
    return 0;
  }
  PyObject* v[N_FIELDS] = {NULL};
  for (int i = 0; i < N_FIELDS; i++) {
    if (fields[i] == NULL && (fields[i] = PyUnicode_InternFromString(field_names[i])) == NULL)
      goto fail;
    if ((v[i] = PyObject_GetAttr(request, fields[i])) == NULL) {
      if (PyErr_ExceptionMatches(PyExc_AttributeError))
        PyErr_Format(PyExc_TypeError, "the request must be an InferRequest, not %.100s",
                     Py_TYPE(request)->tp_name);
      goto fail;
    }
  }
  /* (checked in this order: the first wrong option is the one refused) */
  if (u64_option(v[F_PRIORITY], "priority", TAKES_PRIORITY, &s->priority) < 0 ||
      u64_option(v[F_TIMEOUT_US], "timeout_us", TAKES_TIMEOUT_US, &s->timeout_us) < 0)
    goto fail;
  PyObject* request_id = v[F_REQUEST_ID];
  if (request_id != Py_None && text_of(request_id) == NULL) {
    refuse("request_id", TAKES_REQUEST_ID, request_id, TEXT_HINT(request_id));
    goto fail;
  }
  if ((s->outputs = outputs_of(v[F_OUTPUTS])) == NULL) goto fail;
  PyObject* parameters = v[F_PARAMETERS];
  s->parameters = parameters == Py_None || PyDict_Check(parameters)
                      ? Py_NewRef(parameters)
                      : as_dict(parameters, "parameters", TAKES_PARAMETERS);
  if (s->parameters == NULL) goto fail;
  PyObject* inputs = v[F_INPUTS];
  s->inputs = PyDict_Check(inputs) ? Py_NewRef(inputs)
                                   : as_dict(inputs, "inputs", "a mapping of input name -> array");
  if (s->inputs == NULL) goto fail;
  s->out_device = (int)PyLong_AsLong(v[F_OUTPUT_DEVICE]);
  if (s->out_device == -1 && PyErr_Occurred()) goto fail;
  s->request_id = Py_NewRef(request_id);
  s->sequence = Py_NewRef(v[F_SEQUENCE]);
  s->trace_sink = Py_NewRef(v[F_TRACE_SINK]);
  for (int i = 0; i < N_FIELDS; i++) Py_DECREF(v[i]);
  return 0;

fail:
  for (int i = 0; i < N_FIELDS; i++) Py_XDECREF(v[i]);
  request_spec_clear(s);
  return -1;
}

void request_spec_clear(RequestSpec* s)
{
  Py_CLEAR(s->inputs);
  Py_CLEAR(s->outputs);
  Py_CLEAR(s->request_id);
  Py_CLEAR(s->parameters);
  Py_CLEAR(s->sequence);
  Py_CLEAR(s->trace_sink);
}
