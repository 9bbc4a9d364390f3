/* kserve_pb.c: the KServe-v2 protobuf subset (ModelInferRequest read, ModelInferResponse written).
 */
#ifndef EMBEDTRITON_KSERVE_PB_H
#define EMBEDTRITON_KSERVE_PB_H

#include "common.h"

#define KS_MAX_TENSORS 64

/* A field of the received message (a slice of it, not a copy). */
typedef struct {
  const uint8_t* p;
  size_t n;
} Slice;

typedef struct {
  Slice name, datatype;
  int ndim;
  int64_t shape[MAX_DIMS];
} KsInput;

typedef struct {
  Slice model, version, id;
  int n_inputs, n_outputs, n_raw;
  KsInput inputs[KS_MAX_TENSORS];
  Slice outputs[KS_MAX_TENSORS];
  Slice raw[KS_MAX_TENSORS]; /* (those past the inputs are not used, as in the Python path) */
} KsRequest;

/* The error of an encoding that failed (code, text), as the Python path reports it. */
typedef struct {
  int code;
  const char* text;
} KsError;

/* One output of a Triton response, as TRITONSERVER_InferenceResponseOutput gives it. */
typedef struct {
  const char* name;
  TRITONSERVER_DataType dtype;
  const int64_t* shape;
  uint64_t ndim;
  const void* base;
  size_t size;
  TRITONSERVER_MemoryType mtype;
} KsTensor;

/* Output i of resp into t: 0, or -1 (Triton's error dropped). */
int ks_output(TRITONSERVER_InferenceResponse* resp, uint32_t i, KsTensor* t);

struct H2Reply;
/* Decode a ModelInferRequest into r: 0 for a plain request, -1 for anything else. */
int ks_decode(const uint8_t* data, size_t len, KsRequest* r);
/* The Python path's checks that r passes as it is: 0, or -1 where it would refuse or read it
 * another way. */
int ks_plain(const KsRequest* r);
int slice_eq(Slice a, Slice b);
/* A numeric datatype's Triton type, or INVALID (BYTES, BF16 and unknown names). */
TRITONSERVER_DataType numeric_type(Slice name);
/* The ModelInferResponse of resp, as a message of the _h2 reply interface (NULL, *e set). */
void* ks_encode(const struct H2Reply* h2, Slice model, Slice version, Slice id,
                TRITONSERVER_InferenceResponse* resp, KsError* e);
PyObject* py_kserve_decode(PyObject* self, PyObject* arg);

#endif
