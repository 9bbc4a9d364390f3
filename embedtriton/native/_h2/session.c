/* Streams and the nghttp2 session: a stream's state shared with the threads
 * that answer it (the dirty list, finishing a call), and the nghttp2 callbacks
 * that turn frames into request headers, messages and events (IO thread, no
 * GIL). */
#include "h2.h"

#include <stdio.h>
#include <unistd.h>

/* grpc-message is percent-encoded: bytes outside 0x20..0x7e and '%' become %XX */
char* percent_encode(const char* s, size_t n)
{
  char *out = malloc(n * 3 + 1), *o = out;
  if (!out) return NULL;
  static const char hex[] = "0123456789ABCDEF";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      *o++ = (char)c;
    } else {
      *o++ = '%';
      *o++ = hex[c >> 4];
      *o++ = hex[c & 15];
    }
  }
  *o = 0;
  return out;
}

void wake(ServerObject* srv)
{
  uint64_t one = 1;
  ssize_t r = write(srv->evfd, &one, sizeof one);
  (void)r;
}

/* Put st on the dirty list; return 1 if the caller must wake the IO thread. Holds mu. */
int mark_dirty_locked(ServerObject* srv, Stream* st)
{
  if (!st->dirty) {
    st->dirty = 1;
    st->dprev = NULL;
    st->dnext = srv->dirty_head;
    if (srv->dirty_head) srv->dirty_head->dprev = st;
    srv->dirty_head = st;
  }
  if (srv->in_dispatch || srv->wake_pending) return 0;
  srv->wake_pending = 1;
  return 1;
}

void unlink_dirty_locked(ServerObject* srv, Stream* st)
{
  if (!st->dirty) return;
  if (st->dprev) st->dprev->dnext = st->dnext;
  else srv->dirty_head = st->dnext;
  if (st->dnext) st->dnext->dprev = st->dprev;
  st->dirty = 0;
  st->dprev = st->dnext = NULL;
}

/* Request the end of a call with a status (takes ownership of enc_msg). Holds mu.
 * Returns 1 if it took effect, 0 if the call was already finishing. */
int finish_locked(ServerObject* srv, Stream* st, int code, char* enc_msg, int by_app,
                  int* need_wake)
{
  if (st->finish_req) {
    free(enc_msg);
    return 0;
  }
  st->finish_req = 1;
  st->finished_by_app = by_app;
  st->fin_code = code;
  st->fin_msg = enc_msg;
  *need_wake = mark_dirty_locked(srv, st);
  return 1;
}

/* A status decided by the transport itself (IO thread, no GIL). */
static void finish_internal(Stream* st, int code, const char* msg)
{
  ServerObject* srv = st->conn ? st->conn->srv : NULL;
  if (!srv) return;
  char* enc = percent_encode(msg, strlen(msg));
  int need_wake = 0;
  pthread_mutex_lock(&srv->mu);
  finish_locked(srv, st, code, enc, 0, &need_wake);
  pthread_mutex_unlock(&srv->mu);
  /* no wake needed: the IO thread applies dirty streams later in this iteration */
}

void free_outbufs(OutBuf* b)
{
  while (b) {
    OutBuf* n = b->next;
    free(b);
    b = n;
  }
}

void free_meta(char** meta, size_t nmeta)
{
  if (!meta) return;
  for (size_t i = 0; i < 2 * nmeta; i++) free(meta[i]);
  free(meta);
}

void stream_free(Stream* st)
{
  free(st->path);
  free_meta(st->meta, st->nmeta);
  free(st->msg);
  free_outbufs(st->oq_head);
  free_outbufs(st->pq_head);
  free(st->fin_msg);
  free(st);
}

static void push_event(ServerObject* srv, int type, Stream* st, uint8_t* data, size_t len)
{
  if (srv->nev == srv->capev) {
    srv->capev = srv->capev ? srv->capev * 2 : 64;
    srv->ev = xrealloc(srv->ev, srv->capev * sizeof *srv->ev);
  }
  srv->ev[srv->nev++] = (Event){type, st, data, len};
}

/* The bytes allocated for incomplete request messages change by d: on c (max_buffered_bytes, per
 * connection) and across connections (max_incoming_bytes). */
static void partial_add(Conn* c, int64_t d)
{
  if (d < 0) c->partial -= (size_t)-d;
  else c->partial += (size_t)d;
  STAT_ADD(c->srv->g_partial, d);
}

/* The stream is over for nghttp2 (closed) or its connection died. */
void stream_detach(Stream* st)
{
  Conn* c = st->conn;
  if (!c) return;
  if (st->cprev) st->cprev->cnext = st->cnext;
  else c->streams = st->cnext;
  if (st->cnext) st->cnext->cprev = st->cprev;
  c->nstreams--;
  partial_add(c, -(int64_t)st->msg_cap); /* an incomplete request message goes with its stream */
  st->msg_cap = 0;
  c->last_active =
      c->srv
          ->now; /* a call that outlasted idle_timeout does not make its connection idle at once */
  pthread_mutex_lock(&c->srv->mu); /* send() reads st->conn and the counts under mu */
  st->conn = NULL;
  c->queued -= st->queued;
  st->queued = 0;
  pthread_mutex_unlock(&c->srv->mu);
  st->closed = 1;
  push_event(c->srv, EV_CLOSE, st, NULL, 0);
}

/* ------------------------------------------------------------------------ */
/* nghttp2 callbacks (IO thread, no GIL)                                     */

ssize_t data_read_cb(nghttp2_session* sess, int32_t id, uint8_t* buf, size_t length,
                     uint32_t* flags, nghttp2_data_source* src, void* ud)
{
  Stream* st = src->ptr;
  if (st->reset_sent) return NGHTTP2_ERR_DEFERRED;
  size_t n = 0;
  while (n < length && st->oq_head) {
    OutBuf* b = st->oq_head;
    size_t take = b->len - b->off;
    if (take > length - n) take = length - n;
    memcpy(buf + n, b->data + b->off, take);
    n += take;
    b->off += take;
    if (b->off == b->len) {
      st->oq_head = b->next;
      if (!st->oq_head) st->oq_tail = NULL;
      free(b);
    }
  }
  if (n) {
    ServerObject* srv = ((Conn*)ud)->srv;
    pthread_mutex_lock(&srv->mu);
    st->queued -= n;
    ((Conn*)ud)->queued -= n;
    pthread_mutex_unlock(&srv->mu);
  }
  if (!st->oq_head) {
    if (st->fin_ready && !st->trailers_sent) {
      char code[16];
      int cl = snprintf(code, sizeof code, "%d", st->fin_code);
      const char* m = st->fin_msg ? st->fin_msg : "";
      nghttp2_nv tr[2] = {MAKE_NV("grpc-status", code, (size_t)cl),
                          MAKE_NV("grpc-message", m, strlen(m))};
      *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
      if (ng.submit_trailer(sess, id, tr, m[0] ? 2 : 1) != 0)
        *flags &= ~(uint32_t)NGHTTP2_DATA_FLAG_NO_END_STREAM;
      st->trailers_sent = 1;
      return (ssize_t)n;
    }
    if (n == 0) return NGHTTP2_ERR_DEFERRED;
  }
  return (ssize_t)n;
}

/* Send DATA frames as large as flow control and the peer's frame size allow (up to 1 MiB). */
static ssize_t read_length_cb(nghttp2_session* sess, uint8_t type, int32_t id, int32_t swin,
                              int32_t stwin, uint32_t maxframe, void* ud)
{
  (void)sess, (void)type, (void)id, (void)ud;
  ssize_t n = maxframe;
  if (swin < n) n = swin;
  if (stwin < n) n = stwin;
  if (n > (1 << 20)) n = 1 << 20;
  return n < 1 ? 1 : n;
}

static int on_begin_headers(nghttp2_session* sess, const nghttp2_frame* f, void* ud)
{
  Conn* c = ud;
  if (f->hd.type != NGHTTP2_HEADERS || ng.session_get_stream_user_data(sess, f->hd.stream_id))
    return 0;
  Stream* st = calloc(1, sizeof *st);
  if (!st) return NGHTTP2_ERR_CALLBACK_FAILURE;
  st->conn = c;
  st->id = f->hd.stream_id;
  memcpy(st->peer, c->peer, PEER_LEN);
  st->cnext = c->streams;
  if (c->streams) c->streams->cprev = st;
  c->streams = st;
  c->nstreams++;
  ng.session_set_stream_user_data(sess, st->id, st);
  return 0;
}

static char* dup_n(const uint8_t* s, size_t n)
{
  char* d = malloc(n + 1);
  if (!d) abort();
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

/* At most this many header fields per request (pseudo-headers included), whatever their size:
 * Envoy's and nghttpx's default is 100 as well, and a gRPC client sends about ten. */
#define MAX_HEADER_FIELDS 100

static int on_header(nghttp2_session* sess, const nghttp2_frame* f, const uint8_t* name,
                     size_t namelen, const uint8_t* value, size_t valuelen, uint8_t flags, void* ud)
{
  (void)flags;
  Stream* st = ng.session_get_stream_user_data(sess, f->hd.stream_id);
  if (!st || st->headers_done) return 0; /* trailers from the client: ignored */
  /* HPACK makes a header cheap to send and dear to keep: one byte can refer to a 4 KiB table entry.
   * The list is measured before anything is copied; once over the limit, what was kept is freed and
   * the rest only counted. The request is refused when its header block ends (on_frame_recv). */
  st->hdr_bytes += namelen + valuelen + 32;
  st->hdr_count++;
  if (st->hdr_over) return 0;
  if (st->hdr_bytes > ((Conn*)ud)->srv->max_hdr || st->hdr_count > MAX_HEADER_FIELDS) {
    st->hdr_over = st->hdr_bytes > ((Conn*)ud)->srv->max_hdr ? 1 : 2; /* which limit it met first */
    free_meta(st->meta, st->nmeta);
    st->meta = NULL;
    st->nmeta = st->capmeta = 0;
    return 0;
  }
  if (namelen && name[0] == ':') {
    if (namelen == 5 && !memcmp(name, ":path", 5)) {
      free(st->path);
      st->path = dup_n(value, valuelen);
    } else if (namelen == 7 && !memcmp(name, ":method", 7)) {
      st->is_post = valuelen == 4 && !memcmp(value, "POST", 4);
    }
    return 0;
  }
  if (namelen == 12 && !memcmp(name, "content-type", 12))
    st->ctype_ok = valuelen >= 16 && !memcmp(value, "application/grpc", 16) &&
                   (valuelen == 16 || value[16] == '+' || value[16] == ';');
  else if (namelen == 13 && !memcmp(name, "grpc-encoding", 13))
    st->req_enc = encoding_of((const char*)value, valuelen);
  if (st->nmeta == st->capmeta) {
    st->capmeta = st->capmeta ? st->capmeta * 2 : 8;
    st->meta = xrealloc(st->meta, 2 * st->capmeta * sizeof(char*));
  }
  st->meta[2 * st->nmeta] = dup_n(name, namelen);
  st->meta[2 * st->nmeta + 1] = dup_n(value, valuelen);
  st->nmeta++;
  return 0;
}

/* Refuse a request at its headers (Trailers-Only); accept_enc adds grpc-accept-encoding, the
 * encodings we take. */
static void reject(nghttp2_session* sess, Stream* st, const char* status, int code, const char* msg,
                   int accept_enc)
{
  char* enc = percent_encode(msg, strlen(msg));
  char cs[16];
  int cl = snprintf(cs, sizeof cs, "%d", code);
  nghttp2_nv h[5] = {
      MAKE_NV(":status", status, strlen(status)), MAKE_NV("content-type", "application/grpc", 16),
      MAKE_NV("grpc-status", cs, (size_t)cl), MAKE_NV("grpc-message", enc, strlen(enc)),
      MAKE_NV("grpc-accept-encoding", ACCEPT_ENCODING, sizeof ACCEPT_ENCODING - 1)};
  ng.submit_response(sess, st->id, h, accept_enc ? 5 : 4, NULL);
  free(enc);
  st->rejected = 1;
  st->headers_sent = st->trailers_sent = 1;
  st->finish_req = st->finished_by_app = 1; /* nobody else can see this stream yet */
}

/* A grpc-encoding we cannot decompress: UNIMPLEMENTED, naming it and those we take
 * (grpc-accept-encoding too), as gRPC's compression spec asks; refused at the headers, as grpc-java
 * and grpc-go do, even if no message is compressed.
 */
static void reject_encoding(nghttp2_session* sess, Stream* st)
{
  const char* name = "";
  for (size_t i = 0; i < st->nmeta; i++)
    if (!strcmp(st->meta[2 * i], "grpc-encoding")) name = st->meta[2 * i + 1];
  char m[200];
  snprintf(m, sizeof m,
           "Compression algorithm '%.64s' (grpc-encoding) is not supported; supported: %s", name,
           ACCEPT_ENCODING);
  reject(sess, st, "200", 12, m, 1);
}

static void on_remote_end(Stream* st)
{
  st->remote_closed = 1;
  if (st->rejected || st->skipping) return;
  if (st->pfx_have || st->in_msg) {
    st->skipping = 1;
    finish_internal(st, 13, "the request ended inside a message");
    return;
  }
  push_event(st->conn->srv, EV_HALF_CLOSE, st, NULL, 0);
}

static int on_frame_recv(nghttp2_session* sess, const nghttp2_frame* f, void* ud)
{
  if (f->hd.type ==
      NGHTTP2_SETTINGS) { /* nghttp2 checked the magic; this ends the client's connection preface */
    ((Conn*)ud)->preface_done = 1;
    return 0;
  }
  if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) return 0;
  Stream* st = ng.session_get_stream_user_data(sess, f->hd.stream_id);
  if (!st) return 0;
  if (f->hd.type == NGHTTP2_HEADERS && !st->headers_done) {
    st->headers_done = 1;
    if (st->hdr_over) { /* as grpc-core says it: RESOURCE_EXHAUSTED, naming the limit */
      char m[160];
      size_t limit = ((Conn*)ud)->srv->max_hdr;
      if (st->hdr_over == 2)
        snprintf(m, sizeof m, "received metadata has too many entries (%zu vs. %d)", st->hdr_count,
                 MAX_HEADER_FIELDS);
      else
        snprintf(m, sizeof m, "received metadata size exceeds limit (%zu vs. %zu bytes)",
                 st->hdr_bytes, limit);
      reject(sess, st, "200", 8, m, 0);
    } else if (!st->is_post) reject(sess, st, "405", 13, "gRPC requests must use POST", 0);
    else if (!st->ctype_ok) reject(sess, st, "415", 13, "content-type must be application/grpc", 0);
    else if (!st->path) reject(sess, st, "400", 13, "missing :path", 0);
    else if (st->req_enc == ENC_UNKNOWN) reject_encoding(sess, st);
  }
  if (f->hd.flags & NGHTTP2_FLAG_END_STREAM) on_remote_end(st);
  return 0;
}

/* A request message's buffer starts at this size at most and doubles as its bytes arrive (up to its
 * declared length): a client that declares 64 MiB and sends 5 bytes gets 64 KiB, not 64 MiB. */
#define MSG_FIRST_ALLOC (64 * 1024)

/* Grow (or first allocate) st's message buffer to cap bytes, within the connection's bound on
 * incomplete request messages (max_buffered_bytes, and never less than one message of
 * max_message_bytes): without it, a client could open 1024 streams and leave a large message
 * half-sent on each; and within the server's, across connections (max_incoming_bytes), against
 * many clients doing so. Beyond either the call fails with RESOURCE_EXHAUSTED and the rest of its
 * message is skipped. Returns 0 when it failed. */
static int grow_message(Conn* c, Stream* st, size_t cap)
{
  ServerObject* srv = c->srv;
  size_t bound = srv->max_buf > srv->max_msg ? srv->max_buf : srv->max_msg;
  size_t more = cap - st->msg_cap; /* msg_cap is 0 while st->msg is NULL */
  int over_conn = c->partial + more > bound;
  int over_all = !over_conn && (size_t)STAT_GET(srv->g_partial) + more > srv->max_incoming;
  uint8_t* grown = NULL;
  if (!over_conn && !over_all) grown = realloc(st->msg, cap ? cap : 1);
  if (!grown) {
    char m[200];
    if (over_conn) {
      snprintf(m, sizeof m,
               "the connection holds more than %zu bytes of incomplete request messages", bound);
    } else if (over_all) {
      snprintf(m, sizeof m,
               "the server holds more than %zu bytes of incoming request messages "
               "(max_buffered_bytes); retry later",
               srv->max_incoming);
      STAT_ADD(srv->n_budget, 1);
    } else {
      snprintf(m, sizeof m, "out of memory for the request message");
    }
    partial_add(c, -(int64_t)st->msg_cap);
    free(st->msg);
    st->msg = NULL;
    st->msg_cap = 0;
    st->in_msg = 0;
    st->skipping = 1;
    finish_internal(st, 8, m);
    return 0;
  }
  partial_add(c, (int64_t)more);
  st->msg = grown;
  st->msg_cap = cap;
  return 1;
}

/* Inflate a complete compressed message (taking it) and hand it on; or fail the call and return 0.
 * Done here, on the IO thread without the GIL, bounded by max_message_bytes whatever the message
 * inflates to. */
static int deliver_compressed(Conn* c, Stream* st, uint8_t* msg, size_t n)
{
  uint8_t* out;
  size_t outlen;
  char m[200];
  int code = inflate_message(st->req_enc, msg, n, c->srv->max_msg, &out, &outlen, m, sizeof m);
  free(msg);
  if (code) {
    st->skipping = 1;
    finish_internal(st, code, m);
    return 0;
  }
  push_event(c->srv, EV_MSG, st, out, outlen);
  return 1;
}

static int on_data_chunk(nghttp2_session* sess, uint8_t flags, int32_t id, const uint8_t* data,
                         size_t len, void* ud)
{
  (void)flags;
  Conn* c = ud;
  Stream* st = ng.session_get_stream_user_data(sess, id);
  if (!st || st->rejected || st->skipping) return 0;
  while (len) {
    if (!st->in_msg) {
      size_t take = 5 - (size_t)st->pfx_have;
      if (take > len) take = len;
      memcpy(st->pfx + st->pfx_have, data, take);
      st->pfx_have += (int)take;
      data += take;
      len -= take;
      if (st->pfx_have < 5) break;
      st->pfx_have = 0;
      uint32_t mlen = (uint32_t)st->pfx[1] << 24 | (uint32_t)st->pfx[2] << 16 |
                      (uint32_t)st->pfx[3] << 8 | st->pfx[4];
      if (st->pfx[0] > 1 ||
          (st->pfx[0] == 1 && st->req_enc == ENC_IDENTITY)) { /* grpc-core's words for the latter */
        st->skipping = 1;
        finish_internal(st, 13,
                        st->pfx[0] == 1 ? "Compression bit set but no encoding configured"
                                        : "invalid message flags");
        return 0;
      }
      st->msg_comp = st->pfx[0];
      if (mlen > c->srv->max_msg) {
        char m[160];
        snprintf(m, sizeof m, "received message larger than max (%u vs. %zu bytes)", mlen,
                 c->srv->max_msg);
        st->skipping = 1;
        finish_internal(st, 8, m);
        return 0;
      }
      if (mlen == 0) {
        push_event(c->srv, EV_MSG, st, NULL, 0);
        continue;
      }
      /* The declared length is only a claim: memory grows with the bytes that actually arrive. */
      if (!grow_message(c, st, mlen < MSG_FIRST_ALLOC ? mlen : MSG_FIRST_ALLOC)) return 0;
      st->msg_len = mlen;
      st->msg_have = 0;
      st->in_msg = 1;
    } else {
      size_t take = st->msg_len - st->msg_have;
      if (take > len) take = len;
      if (st->msg_have + take > st->msg_cap) {
        size_t cap = st->msg_cap * 2;
        if (cap < st->msg_have + take) cap = st->msg_have + take;
        if (cap > st->msg_len) cap = st->msg_len;
        if (!grow_message(c, st, cap)) return 0;
      }
      memcpy(st->msg + st->msg_have, data, take);
      st->msg_have += take;
      data += take;
      len -= take;
      if (st->msg_have == st->msg_len) {
        partial_add(c, -(int64_t)st->msg_cap); /* complete: the app owns it from here */
        st->msg_cap = 0;
        uint8_t* msg = st->msg;
        st->msg = NULL;
        st->in_msg = 0;
        if (!st->msg_comp) push_event(c->srv, EV_MSG, st, msg, st->msg_len);
        else if (!deliver_compressed(c, st, msg, st->msg_len)) return 0;
      }
    }
  }
  return 0;
}

static int on_frame_send(nghttp2_session* sess, const nghttp2_frame* f, void* ud)
{
  (void)ud;
  if (f->hd.type != NGHTTP2_HEADERS || !(f->hd.flags & NGHTTP2_FLAG_END_STREAM)) return 0;
  Stream* st = ng.session_get_stream_user_data(sess, f->hd.stream_id);
  /* We ended our side before the client ended its own: tell it to stop sending. */
  if (st && !st->remote_closed)
    ng.submit_rst_stream(sess, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR);
  return 0;
}

static int on_stream_close(nghttp2_session* sess, int32_t id, uint32_t code, void* ud)
{
  (void)code, (void)ud;
  Stream* st = ng.session_get_stream_user_data(sess, id);
  if (st) stream_detach(st);
  return 0;
}

nghttp2_session_callbacks* make_callbacks(void)
{
  nghttp2_session_callbacks* cbs;
  if (ng.session_callbacks_new(&cbs) != 0) return NULL;
  ng.session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
  ng.session_callbacks_set_on_header_callback(cbs, on_header);
  ng.session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
  ng.session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
  ng.session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
  ng.session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
  ng.session_callbacks_set_data_source_read_length_callback(cbs, read_length_cb);
  return cbs;
}
