/* memory.c: output buffers (Triton's response allocator) and shared-memory mappings. */
#ifndef EMBEDTRITON_MEMORY_H
#define EMBEDTRITON_MEMORY_H

#include "common.h"

/* An output buffer's ticket (its buffer_userp), see the response allocator. */
typedef struct {
  void* block;
  int taken;
  int gpu; /* block is device memory (cudaFree), for a call with an output device */
} Ticket;

extern uintptr_t page_size;
extern PyTypeObject MappingType;

TRITONSERVER_Error* response_alloc_fn(TRITONSERVER_ResponseAllocator* a, const char* tensor_name,
                                      size_t byte_size, TRITONSERVER_MemoryType memory_type,
                                      int64_t memory_type_id, void* userp, void** buffer,
                                      void** buffer_userp,
                                      TRITONSERVER_MemoryType* actual_memory_type,
                                      int64_t* actual_memory_type_id);
TRITONSERVER_Error* response_release_fn(TRITONSERVER_ResponseAllocator* a, void* buffer,
                                        void* buffer_userp, size_t byte_size,
                                        TRITONSERVER_MemoryType memory_type,
                                        int64_t memory_type_id);
void free_block_capsule(PyObject* capsule);
PyObject* py_map_shared(PyObject* self, PyObject* args);

#endif
