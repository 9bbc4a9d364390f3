/* inputs.c: a request's inputs (numpy arrays, DLPack) and parameters, and what each request
 * option takes. */
#ifndef EMBEDTRITON_INPUTS_H
#define EMBEDTRITON_INPUTS_H

#include "request.h"

/* What each request option takes, in the words of embedtriton/core/request.py (TAKES): a wrong
 * one is refused as "<option> must be <takes>, not <what it got>" (refuse). */
#define TAKES_PRIORITY "an int from 0 to 2**64-1 (1 is the highest level, 0 the model's default)"
#define TAKES_TIMEOUT_US "an int of microseconds from 0 to 2**64-1 (0: no timeout)"
#define TAKES_REQUEST_ID "a str"
#define TAKES_OUTPUTS "a list of output names (str)"
#define TAKES_OUTPUT "an output name (str)"
#define TAKES_OUTPUT_BUFFER "None or a writable, contiguous buffer"
#define TAKES_PARAMETERS \
  "a mapping of str names to str, int, float or bool values, such as {'k': 1}"
#define TAKES_PARAMETER "a str, a float, a bool or an int from -2**63 to 2**63-1"
#define TAKES_PARAMETER_NAME "a str"
#define TAKES_CORRELATION_ID "an int from 1 to 2**64-1 or a non-empty str"
/* (after a str that text_of refuses) */
#define NOT_TEXT ": a str must be UTF-8 text without NUL characters"
#define TEXT_HINT(value) (PyUnicode_Check(value) ? NOT_TEXT : "")

PyObject* add_input(TRITONSERVER_InferenceRequest* req, PyObject* key, PyObject* value);
int pending_input(PyObject* key, PyObject* value, InputDesc* out);
TRITONSERVER_Error* set_parameter(TRITONSERVER_InferenceRequest* req, PyObject* key,
                                  PyObject* value);

#endif
