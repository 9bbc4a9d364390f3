/* fast_batch.c: a plain @batch function called straight from Triton's buffers. */
#ifndef EMBEDTRITON_FAST_BATCH_H
#define EMBEDTRITON_FAST_BATCH_H

#include "batch_io.h"

int fast_batch_init(ModelState* ms, PyObject* binding);
void fast_batch_free(ModelState* ms);
PyObject* fast_batch_run(ModelState* ms, TRITONBACKEND_Request** requests, uint32_t count,
                         PyObject** views, Py_ssize_t* n_views, uint64_t* sizes,
                         uint64_t* compute_start, TRITONSERVER_Error** err, int* declined);

#endif
