/* Our own declarations of the parts of the libnghttp2 C API (present since
 * nghttp2 1.43 and unchanged in later 1.x) and of OpenSSL 3 that _h2 uses.
 *
 * Neither library is linked at build time: _h2 (libs.c) dlopen()s them and looks the
 * functions up with dlsym(), so the package builds on machines without their
 * development files. Only the struct members we touch are declared where the
 * library hands us a pointer (nghttp2_frame: every member of that union starts
 * with the frame header). */
#ifndef EMBEDTRITON_NGHTTP2_API_H
#define EMBEDTRITON_NGHTTP2_API_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- nghttp2 ---- */

typedef struct nghttp2_session nghttp2_session;
typedef struct nghttp2_session_callbacks nghttp2_session_callbacks;
typedef struct nghttp2_option nghttp2_option;

typedef struct {
  uint8_t* name;
  uint8_t* value;
  size_t namelen;
  size_t valuelen;
  uint8_t flags;
} nghttp2_nv;

typedef struct {
  size_t length;
  int32_t stream_id;
  uint8_t type;
  uint8_t flags;
  uint8_t reserved;
} nghttp2_frame_hd;

typedef union {
  nghttp2_frame_hd hd; /* the other members (headers, data, ...) are not read */
} nghttp2_frame;

typedef union {
  int fd;
  void* ptr;
} nghttp2_data_source;

/* what nghttp2_version() returns (the members that exist since age 1) */
typedef struct {
  int age;
  int version_num; /* 0xMMmmpp */
  const char* version_str;
  const char* proto_str;
} nghttp2_info;

typedef ssize_t (*nghttp2_data_source_read_callback)(nghttp2_session* session, int32_t stream_id,
                                                     uint8_t* buf, size_t length,
                                                     uint32_t* data_flags,
                                                     nghttp2_data_source* source, void* user_data);

typedef struct {
  nghttp2_data_source source;
  nghttp2_data_source_read_callback read_callback;
} nghttp2_data_provider;

typedef struct {
  int32_t settings_id;
  uint32_t value;
} nghttp2_settings_entry;

typedef int (*nghttp2_on_begin_headers_callback)(nghttp2_session*, const nghttp2_frame*, void*);
typedef int (*nghttp2_on_header_callback)(nghttp2_session*, const nghttp2_frame*,
                                          const uint8_t* name, size_t namelen, const uint8_t* value,
                                          size_t valuelen, uint8_t flags, void* user_data);
typedef int (*nghttp2_on_frame_recv_callback)(nghttp2_session*, const nghttp2_frame*, void*);
typedef int (*nghttp2_on_frame_send_callback)(nghttp2_session*, const nghttp2_frame*, void*);
typedef int (*nghttp2_on_data_chunk_recv_callback)(nghttp2_session*, uint8_t flags,
                                                   int32_t stream_id, const uint8_t* data,
                                                   size_t len, void* user_data);
typedef int (*nghttp2_on_stream_close_callback)(nghttp2_session*, int32_t stream_id,
                                                uint32_t error_code, void* user_data);
typedef ssize_t (*nghttp2_data_source_read_length_callback)(
    nghttp2_session*, uint8_t frame_type, int32_t stream_id, int32_t session_remote_window_size,
    int32_t stream_remote_window_size, uint32_t remote_max_frame_size, void* user_data);

/* frame types */
enum {
  NGHTTP2_DATA = 0,
  NGHTTP2_HEADERS = 1,
  NGHTTP2_RST_STREAM = 3,
  NGHTTP2_SETTINGS = 4,
  NGHTTP2_GOAWAY = 7
};
/* frame flags */
enum { NGHTTP2_FLAG_NONE = 0, NGHTTP2_FLAG_END_STREAM = 0x01 };
/* data provider flags */
enum { NGHTTP2_DATA_FLAG_EOF = 0x01, NGHTTP2_DATA_FLAG_NO_END_STREAM = 0x02 };
/* nv flags */
enum { NGHTTP2_NV_FLAG_NONE = 0 };
/* SETTINGS ids */
enum {
  NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS = 0x03,
  NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE = 0x04,
  NGHTTP2_SETTINGS_MAX_FRAME_SIZE = 0x05,
  NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE = 0x06,
};
/* library error codes */
enum { NGHTTP2_ERR_DEFERRED = -508, NGHTTP2_ERR_CALLBACK_FAILURE = -902 };
/* HTTP/2 error codes */
enum {
  NGHTTP2_NO_ERROR = 0,
  NGHTTP2_INTERNAL_ERROR = 2,
  NGHTTP2_CANCEL = 8,
  NGHTTP2_ENHANCE_YOUR_CALM = 0x0b
};

/* X(return type, name without the "nghttp2_" prefix, parameter list) */
#define ET_NGHTTP2_FUNCS(X)                                                                     \
  X(int, session_callbacks_new, (nghttp2_session_callbacks**))                                  \
  X(void, session_callbacks_del, (nghttp2_session_callbacks*))                                  \
  X(void, session_callbacks_set_on_begin_headers_callback,                                      \
    (nghttp2_session_callbacks*, nghttp2_on_begin_headers_callback))                            \
  X(void, session_callbacks_set_on_header_callback,                                             \
    (nghttp2_session_callbacks*, nghttp2_on_header_callback))                                   \
  X(void, session_callbacks_set_on_frame_recv_callback,                                         \
    (nghttp2_session_callbacks*, nghttp2_on_frame_recv_callback))                               \
  X(void, session_callbacks_set_on_frame_send_callback,                                         \
    (nghttp2_session_callbacks*, nghttp2_on_frame_send_callback))                               \
  X(void, session_callbacks_set_on_data_chunk_recv_callback,                                    \
    (nghttp2_session_callbacks*, nghttp2_on_data_chunk_recv_callback))                          \
  X(void, session_callbacks_set_on_stream_close_callback,                                       \
    (nghttp2_session_callbacks*, nghttp2_on_stream_close_callback))                             \
  X(void, session_callbacks_set_data_source_read_length_callback,                               \
    (nghttp2_session_callbacks*, nghttp2_data_source_read_length_callback))                     \
  X(int, session_server_new, (nghttp2_session**, const nghttp2_session_callbacks*, void*))      \
  X(void, session_del, (nghttp2_session*))                                                      \
  X(ssize_t, session_mem_recv, (nghttp2_session*, const uint8_t*, size_t))                      \
  X(ssize_t, session_mem_send, (nghttp2_session*, const uint8_t**))                             \
  X(int, session_want_read, (nghttp2_session*))                                                 \
  X(int, session_want_write, (nghttp2_session*))                                                \
  X(void*, session_get_stream_user_data, (nghttp2_session*, int32_t))                           \
  X(int, session_set_stream_user_data, (nghttp2_session*, int32_t, void*))                      \
  X(int, session_set_local_window_size, (nghttp2_session*, uint8_t, int32_t, int32_t))          \
  X(int, session_resume_data, (nghttp2_session*, int32_t))                                      \
  X(int, submit_settings, (nghttp2_session*, uint8_t, const nghttp2_settings_entry*, size_t))   \
  X(int, submit_response,                                                                       \
    (nghttp2_session*, int32_t, const nghttp2_nv*, size_t, const nghttp2_data_provider*))       \
  X(int, submit_trailer, (nghttp2_session*, int32_t, const nghttp2_nv*, size_t))                \
  X(int, submit_rst_stream, (nghttp2_session*, uint8_t, int32_t, uint32_t))                     \
  X(int, submit_goaway, (nghttp2_session*, uint8_t, int32_t, uint32_t, const uint8_t*, size_t)) \
  X(int32_t, session_get_last_proc_stream_id, (nghttp2_session*))                               \
  X(nghttp2_info*, version, (int))                                                              \
  X(const char*, strerror, (int))

/* ---- OpenSSL 3 (libssl, which pulls in libcrypto) ---- */

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_method_st SSL_METHOD;
typedef struct x509_store_ctx_st X509_STORE_CTX;

typedef int (*et_ssl_verify_cb)(int, X509_STORE_CTX*);
typedef int (*et_ssl_alpn_select_cb)(SSL*, const unsigned char** out, unsigned char* outlen,
                                     const unsigned char* in, unsigned int inlen, void* arg);

enum { ET_SSL_FILETYPE_PEM = 1 };
enum { ET_SSL_VERIFY_PEER = 0x01, ET_SSL_VERIFY_FAIL_IF_NO_PEER_CERT = 0x02 };
enum { ET_SSL_TLSEXT_ERR_OK = 0, ET_SSL_TLSEXT_ERR_ALERT_FATAL = 2 };
enum {
  ET_SSL_ERROR_SSL = 1,
  ET_SSL_ERROR_WANT_READ = 2,
  ET_SSL_ERROR_WANT_WRITE = 3,
  ET_SSL_ERROR_SYSCALL = 5,
  ET_SSL_ERROR_ZERO_RETURN = 6,
};
/* SSL_CTX_ctrl commands and SSL_MODE bits */
enum { ET_SSL_CTRL_MODE = 33, ET_SSL_CTRL_SET_MIN_PROTO_VERSION = 123 };
enum { ET_SSL_MODE_ENABLE_PARTIAL_WRITE = 0x1, ET_SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER = 0x2 };
enum { ET_TLS1_2_VERSION = 0x0303 };

/* X(return type, full name, parameter list) */
#define ET_SSL_FUNCS(X)                                                         \
  X(const SSL_METHOD*, TLS_server_method, (void))                               \
  X(SSL_CTX*, SSL_CTX_new, (const SSL_METHOD*))                                 \
  X(void, SSL_CTX_free, (SSL_CTX*))                                             \
  X(long, SSL_CTX_ctrl, (SSL_CTX*, int, long, void*))                           \
  X(int, SSL_CTX_use_certificate_chain_file, (SSL_CTX*, const char*))           \
  X(int, SSL_CTX_use_PrivateKey_file, (SSL_CTX*, const char*, int))             \
  X(int, SSL_CTX_check_private_key, (const SSL_CTX*))                           \
  X(int, SSL_CTX_load_verify_locations, (SSL_CTX*, const char*, const char*))   \
  X(void, SSL_CTX_set_verify, (SSL_CTX*, int, et_ssl_verify_cb))                \
  X(void, SSL_CTX_set_alpn_select_cb, (SSL_CTX*, et_ssl_alpn_select_cb, void*)) \
  X(SSL*, SSL_new, (SSL_CTX*))                                                  \
  X(void, SSL_free, (SSL*))                                                     \
  X(int, SSL_set_fd, (SSL*, int))                                               \
  X(void, SSL_set_accept_state, (SSL*))                                         \
  X(int, SSL_do_handshake, (SSL*))                                              \
  X(int, SSL_read, (SSL*, void*, int))                                          \
  X(int, SSL_write, (SSL*, const void*, int))                                   \
  X(int, SSL_get_error, (const SSL*, int))                                      \
  X(int, SSL_pending, (const SSL*))                                             \
  X(unsigned long, ERR_get_error, (void))                                       \
  X(void, ERR_clear_error, (void))                                              \
  X(void, ERR_error_string_n, (unsigned long, char*, size_t))

#endif
