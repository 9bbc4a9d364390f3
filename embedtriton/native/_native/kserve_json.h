/* kserve_json.c, kserve_json_write.c: the KServe-v2 JSON subset (HTTP/REST, with the binary
 * tensor data extension), read and written. */
#ifndef EMBEDTRITON_KSERVE_JSON_H
#define EMBEDTRITON_KSERVE_JSON_H

#include "kserve_pb.h"

/* An inference request body decoded: r (its model and version are the URL's, set by the
 * caller), each requested output's binary_data, and the JSON inputs' values (converted into
 * `values`, which r's raw slices point into; the binary ones point into the body). */
typedef struct {
  KsRequest r;
  int8_t out_flag[KS_MAX_TENSORS];
  int binary_default;
  void* values;
} KjRequest;

/* What an answer needs of its request. */
typedef struct {
  Slice model, version, id;
  int binary_default, n_outputs;
  const Slice* outputs; /* the names asked for (n_outputs), bit k of out_bits: binary_data */
  uint64_t out_bits;
} KjAnswer;

/* Decode a body (header_len >= 0: the binary tensor data extension's JSON length): 0 for a plain
 * request (kj_clear() frees its values), -1 for anything else (nothing left allocated). */
int kj_decode(const uint8_t* body, size_t len, int64_t header_len, KjRequest* q);
void kj_clear(KjRequest* q);
/* The answer of resp (malloc'd, *len bytes; *header_len: the JSON's length when binary outputs
 * follow it, else 0), or NULL with *e set. */
char* kj_encode(const KjAnswer* a, TRITONSERVER_InferenceResponse* resp, size_t* len,
                size_t* header_len, KsError* e);
/* A double as Python's repr writes it (json.dumps' NaN, Infinity), at most 25 bytes at p: the
 * end. */
char* kj_double_text(char* p, double v);
/* {"error": message} (malloc'd), NULL when out of memory. */
char* kj_error(const char* message, size_t* len);
PyObject* py_kserve_json_decode(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* py_kserve_json_double(PyObject* self, PyObject* arg);

#endif
