/* modes.c: batch rules, decoupled models, iterative sequences. */
#ifndef EMBEDTRITON_MODES_H
#define EMBEDTRITON_MODES_H

#include "batch_io.h"

void run_decoupled(ModelState* ms, TRITONBACKEND_Request** requests, uint32_t count,
                   PyObject* steps, uint64_t* sizes, TRITONSERVER_Error** errors);
void run_iterative(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                   TRITONBACKEND_Request** requests, uint32_t count, uint64_t exec_start);

#endif
