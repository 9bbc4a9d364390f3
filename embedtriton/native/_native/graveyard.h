/* graveyard.c: requests and responses deleted late. */
#ifndef EMBEDTRITON_GRAVEYARD_H
#define EMBEDTRITON_GRAVEYARD_H

#include "common.h"

void bury(TRITONSERVER_InferenceRequest* request, TRITONSERVER_InferenceResponse* response);
void delete_sent(TRITONSERVER_InferenceResponse* response);
/* Graves deleted per call (a call buries two): by a sync caller as it waits
 * (without the GIL), by an async one as it submits (with the GIL, but deleting
 * a few dozen at once costs less per grave than four at a time). */
#define GRAVE_STEP_WAITING 4
#define GRAVE_STEP_ASYNC 32
long delete_buried(long limit);
PyObject* py_delete_released(PyObject* self, PyObject* unused);
PyObject* py_response_stats(PyObject* self, PyObject* unused);

#endif
