/* Our own declarations of the parts of Triton's C API (TRITONSERVER 1.34 /
 * TRITONBACKEND 1.19, Triton 2.51) that the native module uses.
 *
 * The library is not linked at build time: the functions are looked up with
 * dlsym() in the already-loaded libtritonserver (see et_api_load), so the
 * package builds and imports on machines without a Triton runtime. */
#ifndef EMBEDTRITON_TRITON_API_H
#define EMBEDTRITON_TRITON_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONSERVER_Server TRITONSERVER_Server;
typedef struct TRITONSERVER_InferenceRequest TRITONSERVER_InferenceRequest;
typedef struct TRITONSERVER_InferenceResponse TRITONSERVER_InferenceResponse;
typedef struct TRITONSERVER_InferenceTrace TRITONSERVER_InferenceTrace;
typedef struct TRITONSERVER_ResponseAllocator TRITONSERVER_ResponseAllocator;
typedef struct TRITONBACKEND_Model TRITONBACKEND_Model;
typedef struct TRITONBACKEND_ModelInstance TRITONBACKEND_ModelInstance;
typedef struct TRITONBACKEND_Request TRITONBACKEND_Request;
typedef struct TRITONBACKEND_Response TRITONBACKEND_Response;
typedef struct TRITONBACKEND_Input TRITONBACKEND_Input;
typedef struct TRITONBACKEND_Output TRITONBACKEND_Output;
typedef struct TRITONBACKEND_Backend TRITONBACKEND_Backend;
typedef struct TRITONBACKEND_ResponseFactory TRITONBACKEND_ResponseFactory;
typedef struct TRITONBACKEND_Batcher TRITONBACKEND_Batcher;

typedef enum {
  TRITONSERVER_TYPE_INVALID,
  TRITONSERVER_TYPE_BOOL,
  TRITONSERVER_TYPE_UINT8,
  TRITONSERVER_TYPE_UINT16,
  TRITONSERVER_TYPE_UINT32,
  TRITONSERVER_TYPE_UINT64,
  TRITONSERVER_TYPE_INT8,
  TRITONSERVER_TYPE_INT16,
  TRITONSERVER_TYPE_INT32,
  TRITONSERVER_TYPE_INT64,
  TRITONSERVER_TYPE_FP16,
  TRITONSERVER_TYPE_FP32,
  TRITONSERVER_TYPE_FP64,
  TRITONSERVER_TYPE_BYTES,
  TRITONSERVER_TYPE_BF16
} TRITONSERVER_DataType;

typedef enum {
  TRITONSERVER_MEMORY_CPU,
  TRITONSERVER_MEMORY_CPU_PINNED,
  TRITONSERVER_MEMORY_GPU
} TRITONSERVER_MemoryType;

typedef enum {
  TRITONSERVER_PARAMETER_STRING,
  TRITONSERVER_PARAMETER_INT,
  TRITONSERVER_PARAMETER_BOOL,
  TRITONSERVER_PARAMETER_DOUBLE,
  TRITONSERVER_PARAMETER_BYTES
} TRITONSERVER_ParameterType;

typedef enum {
  TRITONSERVER_ERROR_UNKNOWN,
  TRITONSERVER_ERROR_INTERNAL,
  TRITONSERVER_ERROR_NOT_FOUND,
  TRITONSERVER_ERROR_INVALID_ARG,
  TRITONSERVER_ERROR_UNAVAILABLE,
  TRITONSERVER_ERROR_UNSUPPORTED,
  TRITONSERVER_ERROR_ALREADY_EXISTS,
  TRITONSERVER_ERROR_CANCELLED
} TRITONSERVER_Error_Code;

enum { TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1 };
enum { TRITONSERVER_TRACE_LEVEL_TIMESTAMPS = 0x4 };
enum { TRITONSERVER_TRACE_ACTIVITIES = 7 }; /* REQUEST_START (0) .. REQUEST_END (6) */

typedef void (*TRITONSERVER_InferenceTraceActivityFn_t)(TRITONSERVER_InferenceTrace* trace,
                                                        int activity, uint64_t timestamp_ns,
                                                        void* userp);
typedef void (*TRITONSERVER_InferenceTraceReleaseFn_t)(TRITONSERVER_InferenceTrace* trace,
                                                       void* userp);
enum { TRITONSERVER_REQUEST_RELEASE_ALL = 1 };

typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorAllocFn_t)(
    TRITONSERVER_ResponseAllocator* allocator, const char* tensor_name, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id, void* userp, void** buffer,
    void** buffer_userp, TRITONSERVER_MemoryType* actual_memory_type,
    int64_t* actual_memory_type_id);
typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorReleaseFn_t)(
    TRITONSERVER_ResponseAllocator* allocator, void* buffer, void* buffer_userp, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id);
typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorStartFn_t)(
    TRITONSERVER_ResponseAllocator* allocator, void* userp);
typedef void (*TRITONSERVER_InferenceRequestReleaseFn_t)(TRITONSERVER_InferenceRequest* request,
                                                         const uint32_t flags, void* userp);
typedef void (*TRITONSERVER_InferenceResponseCompleteFn_t)(TRITONSERVER_InferenceResponse* response,
                                                           const uint32_t flags, void* userp);

/* X(return type, name, (parameters)) for every function we call. */
#define ET_TRITON_FUNCTIONS(X)                                                                     \
  X(TRITONSERVER_Error*, TRITONSERVER_ErrorNew, (TRITONSERVER_Error_Code code, const char* msg))   \
  X(void, TRITONSERVER_ErrorDelete, (TRITONSERVER_Error * error))                                  \
  X(TRITONSERVER_Error_Code, TRITONSERVER_ErrorCode, (TRITONSERVER_Error * error))                 \
  X(const char*, TRITONSERVER_ErrorMessage, (TRITONSERVER_Error * error))                          \
  X(TRITONSERVER_Error*, TRITONSERVER_ResponseAllocatorNew,                                        \
    (TRITONSERVER_ResponseAllocator * *allocator,                                                  \
     TRITONSERVER_ResponseAllocatorAllocFn_t alloc_fn,                                             \
     TRITONSERVER_ResponseAllocatorReleaseFn_t release_fn,                                         \
     TRITONSERVER_ResponseAllocatorStartFn_t start_fn))                                            \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestNew,                                         \
    (TRITONSERVER_InferenceRequest * *inference_request, TRITONSERVER_Server * server,             \
     const char* model_name, const int64_t model_version))                                         \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestDelete,                                      \
    (TRITONSERVER_InferenceRequest * inference_request))                                           \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestSetId,                                       \
    (TRITONSERVER_InferenceRequest * inference_request, const char* id))                           \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestSetPriorityUInt64,                           \
    (TRITONSERVER_InferenceRequest * inference_request, uint64_t priority))                        \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestSetTimeoutMicroseconds,                      \
    (TRITONSERVER_InferenceRequest * inference_request, uint64_t timeout_us))                      \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestSetCorrelationId,                            \
    (TRITONSERVER_InferenceRequest * inference_request, uint64_t correlation_id))                  \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestSetCorrelationIdString,                      \
    (TRITONSERVER_InferenceRequest * inference_request, const char* correlation_id))               \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestSetFlags,                                    \
    (TRITONSERVER_InferenceRequest * inference_request, uint32_t flags))                           \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestCorrelationId,                                       \
    (TRITONBACKEND_Request * request, uint64_t* id))                                               \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestCorrelationIdString,                                 \
    (TRITONBACKEND_Request * request, const char** id))                                            \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestAddInput,                                    \
    (TRITONSERVER_InferenceRequest * inference_request, const char* name,                          \
     const TRITONSERVER_DataType datatype, const int64_t* shape, uint64_t dim_count))              \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestAppendInputData,                             \
    (TRITONSERVER_InferenceRequest * inference_request, const char* name, const void* base,        \
     size_t byte_size, TRITONSERVER_MemoryType memory_type, int64_t memory_type_id))               \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestAddRequestedOutput,                          \
    (TRITONSERVER_InferenceRequest * inference_request, const char* name))                         \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestSetStringParameter,                          \
    (TRITONSERVER_InferenceRequest * request, const char* key, const char* value))                 \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestSetIntParameter,                             \
    (TRITONSERVER_InferenceRequest * request, const char* key, const int64_t value))               \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestSetBoolParameter,                            \
    (TRITONSERVER_InferenceRequest * request, const char* key, const bool value))                  \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestSetDoubleParameter,                          \
    (TRITONSERVER_InferenceRequest * request, const char* key, const double value))                \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestSetReleaseCallback,                          \
    (TRITONSERVER_InferenceRequest * inference_request,                                            \
     TRITONSERVER_InferenceRequestReleaseFn_t request_release_fn, void* request_release_userp))    \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestSetResponseCallback,                         \
    (TRITONSERVER_InferenceRequest * inference_request,                                            \
     TRITONSERVER_ResponseAllocator * response_allocator, void* response_allocator_userp,          \
     TRITONSERVER_InferenceResponseCompleteFn_t response_fn, void* response_userp))                \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceRequestCancel,                                      \
    (TRITONSERVER_InferenceRequest * inference_request))                                           \
  X(TRITONSERVER_Error*, TRITONSERVER_ServerInferAsync,                                            \
    (TRITONSERVER_Server * server, TRITONSERVER_InferenceRequest * inference_request,              \
     TRITONSERVER_InferenceTrace * trace))                                                         \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceTraceNew,                                           \
    (TRITONSERVER_InferenceTrace * *trace, int level, uint64_t parent_id,                          \
     TRITONSERVER_InferenceTraceActivityFn_t activity_fn,                                          \
     TRITONSERVER_InferenceTraceReleaseFn_t release_fn, void* trace_userp))                        \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceTraceDelete, (TRITONSERVER_InferenceTrace * trace)) \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceTraceId,                                            \
    (TRITONSERVER_InferenceTrace * trace, uint64_t* id))                                           \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceTraceParentId,                                      \
    (TRITONSERVER_InferenceTrace * trace, uint64_t* parent_id))                                    \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceTraceModelName,                                     \
    (TRITONSERVER_InferenceTrace * trace, const char** model_name))                                \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceResponseDelete,                                     \
    (TRITONSERVER_InferenceResponse * inference_response))                                         \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceResponseError,                                      \
    (TRITONSERVER_InferenceResponse * inference_response))                                         \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceResponseOutputCount,                                \
    (TRITONSERVER_InferenceResponse * inference_response, uint32_t* count))                        \
  X(TRITONSERVER_Error*, TRITONSERVER_InferenceResponseOutput,                                     \
    (TRITONSERVER_InferenceResponse * inference_response, const uint32_t index, const char** name, \
     TRITONSERVER_DataType* datatype, const int64_t** shape, uint64_t* dim_count,                  \
     const void** base, size_t* byte_size, TRITONSERVER_MemoryType* memory_type,                   \
     int64_t* memory_type_id, void** userp))                                                       \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelName,                                                  \
    (TRITONBACKEND_Model * model, const char** name))                                              \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelServer,                                                \
    (TRITONBACKEND_Model * model, TRITONSERVER_Server * *server))                                  \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelVersion,                                               \
    (TRITONBACKEND_Model * model, uint64_t* version))                                              \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelRepository,                                            \
    (TRITONBACKEND_Model * model, int* artifact_type, const char** location))                      \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelSetState, (TRITONBACKEND_Model * model, void* state))  \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelState, (TRITONBACKEND_Model * model, void** state))    \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelInstanceModel,                                         \
    (TRITONBACKEND_ModelInstance * instance, TRITONBACKEND_Model * *model))                        \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelInstanceDeviceId,                                      \
    (TRITONBACKEND_ModelInstance * instance, int32_t* device_id))                                  \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelInstanceReportStatistics,                              \
    (TRITONBACKEND_ModelInstance * instance, TRITONBACKEND_Request * request, const bool success,  \
     const uint64_t exec_start_ns, const uint64_t compute_start_ns, const uint64_t compute_end_ns, \
     const uint64_t exec_end_ns))                                                                  \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelInstanceReportBatchStatistics,                         \
    (TRITONBACKEND_ModelInstance * instance, const uint64_t batch_size,                            \
     const uint64_t exec_start_ns, const uint64_t compute_start_ns, const uint64_t compute_end_ns, \
     const uint64_t exec_end_ns))                                                                  \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestInputCount,                                          \
    (TRITONBACKEND_Request * request, uint32_t* count))                                            \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestInputByIndex,                                        \
    (TRITONBACKEND_Request * request, const uint32_t index, TRITONBACKEND_Input** input))          \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestIsCancelled,                                         \
    (TRITONBACKEND_Request * request, bool* is_cancelled))                                         \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestInput,                                               \
    (TRITONBACKEND_Request * request, const char* name, TRITONBACKEND_Input** input))              \
  X(TRITONSERVER_Error*, TRITONBACKEND_InputProperties,                                            \
    (TRITONBACKEND_Input * input, const char** name, TRITONSERVER_DataType* datatype,              \
     const int64_t** shape, uint32_t* dims_count, uint64_t* byte_size, uint32_t* buffer_count))    \
  X(TRITONSERVER_Error*, TRITONBACKEND_InputBuffer,                                                \
    (TRITONBACKEND_Input * input, const uint32_t index, const void** buffer,                       \
     uint64_t* buffer_byte_size, TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id))   \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestOutputCount,                                         \
    (TRITONBACKEND_Request * request, uint32_t* count))                                            \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestOutputName,                                          \
    (TRITONBACKEND_Request * request, const uint32_t index, const char** output_name))             \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestParameterCount,                                      \
    (TRITONBACKEND_Request * request, uint32_t* count))                                            \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestParameter,                                           \
    (TRITONBACKEND_Request * request, const uint32_t index, const char** key,                      \
     TRITONSERVER_ParameterType* type, const void** vvalue))                                       \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestRelease,                                             \
    (TRITONBACKEND_Request * request, uint32_t release_flags))                                     \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseNew,                                                \
    (TRITONBACKEND_Response * *response, TRITONBACKEND_Request * request))                         \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseDelete, (TRITONBACKEND_Response * response))        \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseOutput,                                             \
    (TRITONBACKEND_Response * response, TRITONBACKEND_Output * *output, const char* name,          \
     const TRITONSERVER_DataType datatype, const int64_t* shape, const uint32_t dims_count))       \
  X(TRITONSERVER_Error*, TRITONBACKEND_OutputBuffer,                                               \
    (TRITONBACKEND_Output * output, void** buffer, const uint64_t buffer_byte_size,                \
     TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id))                               \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseFactoryNew,                                         \
    (TRITONBACKEND_ResponseFactory * *factory, TRITONBACKEND_Request * request))                   \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseFactoryDelete,                                      \
    (TRITONBACKEND_ResponseFactory * factory))                                                     \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseFactorySendFlags,                                   \
    (TRITONBACKEND_ResponseFactory * factory, const uint32_t send_flags))                          \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseFactoryIsCancelled,                                 \
    (TRITONBACKEND_ResponseFactory * factory, bool* is_cancelled))                                 \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseNewFromFactory,                                     \
    (TRITONBACKEND_Response * *response, TRITONBACKEND_ResponseFactory * factory))                 \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseSend,                                               \
    (TRITONBACKEND_Response * response, const uint32_t send_flags, TRITONSERVER_Error* error))

#define ET_DECLARE_POINTER(ret, name, params) ret(*name) params;
typedef struct {
  ET_TRITON_FUNCTIONS(ET_DECLARE_POINTER)
} et_api_t;
#undef ET_DECLARE_POINTER

#endif
