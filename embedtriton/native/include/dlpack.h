/* The parts of the DLPack ABI (the stable 0.x layout, exchanged as a "dltensor"
 * capsule by __dlpack__()) that the native module reads, declared here from the
 * ABI itself: the field order and widths and the numeric codes must match what
 * producers (numpy, torch, cupy, jax, ...) lay out in memory. */
#ifndef EMBEDTRITON_DLPACK_H
#define EMBEDTRITON_DLPACK_H

#include <stdint.h>

/* Where a tensor's memory lives: a device type (below) and its index. */
typedef struct {
  int32_t device_type;
  int32_t device_id;
} DLDevice;

/* An element type: a type code (below), its width in bits and its vector lanes
 * (1 for scalars). */
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data; /* the allocation; the first element is at data + byte_offset */
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;   /* ndim extents */
  int64_t* strides; /* in elements; NULL: C-contiguous */
  uint64_t byte_offset;
} DLTensor;

/* What the capsule points at: the tensor, and the producer's context and
 * deleter, which the consumer calls once it no longer needs the memory. */
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

/* Device types: host memory, CUDA device memory, CUDA pinned host memory. */
enum { DL_CPU = 1, DL_CUDA = 2, DL_CUDA_HOST = 3 };

/* Type codes: signed and unsigned integers, IEEE floats, bfloat16, booleans. */
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4, DL_BOOL = 6 };

#endif
