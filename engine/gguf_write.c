/* GGUF v3 writer. Design: every key/value is serialized to its on-disk bytes when it is set, so
 * the header is a concatenation; tensor offsets are planned at write time from the alignment the
 * metadata names. The file is streamed to a temporary name beside the destination and renamed
 * into place only after fsync, so a reader never sees a partial file under the final name. */
#include "gguf_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "the writer copies host integers as GGUF's little-endian values");

#define GGUF_NAME_MAX 63 /* llama.cpp's GGML_MAX_NAME (64) less the NUL */

struct wkv {
    char *key;
    uint32_t type;
    unsigned char *val; /* the bytes after the type field */
    size_t val_len;
};

struct wtensor {
    char *name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    enum qtype type;
    uint64_t nbytes;
};

struct gguf_writer {
    struct wkv *kv;
    uint64_t n_kv, cap_kv;
    struct wtensor *t;
    uint64_t n_t, cap_t;
};

/* A growable byte buffer for the header. */
struct wbuf {
    unsigned char *p;
    size_t n, cap;
    bool oom;
};

static void wb_put(struct wbuf *b, const void *d, size_t n)
{
    if (b->oom || n == 0) return;
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->n < n) cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void wb_u32(struct wbuf *b, uint32_t v)
{
    wb_put(b, &v, 4);
}

static void wb_u64(struct wbuf *b, uint64_t v)
{
    wb_put(b, &v, 8);
}

static void wb_str(struct wbuf *b, const char *s, uint64_t len)
{
    wb_u64(b, len);
    wb_put(b, s, (size_t)len);
}

int gguf_writer_init(struct gguf_writer **out, struct qerr *err)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : qerr_set(err, QERR_NOMEM, "gguf writer: out of memory");
}

void gguf_writer_free(struct gguf_writer *w)
{
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (uint64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

static struct wkv *find_kv(const struct gguf_writer *w, const char *key)
{
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) return &w->kv[i];
    return NULL;
}

/* Sets key to a value of type whose serialized bytes are the wbuf's (taken over). */
static int set_kv(struct gguf_writer *w, const char *key, uint32_t type, struct wbuf *val,
                  struct qerr *err)
{
    if (val->oom) {
        free(val->p);
        return qerr_set(err, QERR_NOMEM, "gguf writer: metadata '%s': out of memory", key);
    }
    if (!key || !*key) {
        free(val->p);
        return qerr_set(err, QERR_INVALID, "gguf writer: empty metadata key");
    }
    struct wkv *kv = find_kv(w, key);
    if (!kv) {
        if (w->n_kv == w->cap_kv) {
            uint64_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
            struct wkv *p = realloc(w->kv, cap * sizeof *p);
            if (!p) {
                free(val->p);
                return qerr_set(err, QERR_NOMEM, "gguf writer: metadata '%s': out of memory", key);
            }
            w->kv = p;
            w->cap_kv = cap;
        }
        char *k = strdup(key);
        if (!k) {
            free(val->p);
            return qerr_set(err, QERR_NOMEM, "gguf writer: metadata '%s': out of memory", key);
        }
        kv = &w->kv[w->n_kv++];
        *kv = (struct wkv){.key = k};
    }
    free(kv->val);
    kv->type = type;
    kv->val = val->p;
    kv->val_len = val->n;
    return 0;
}

static int set_scalar(struct gguf_writer *w, const char *key, uint32_t type, const void *v,
                      struct qerr *err)
{
    struct wbuf b = {0};
    wb_put(&b, v, gguf_vtype_size(type));
    return set_kv(w, key, type, &b, err);
}

int gguf_writer_set_u8(struct gguf_writer *w, const char *key, uint8_t v, struct qerr *err)
{
    return set_scalar(w, key, GGUF_U8, &v, err);
}
int gguf_writer_set_i8(struct gguf_writer *w, const char *key, int8_t v, struct qerr *err)
{
    return set_scalar(w, key, GGUF_I8, &v, err);
}
int gguf_writer_set_u16(struct gguf_writer *w, const char *key, uint16_t v, struct qerr *err)
{
    return set_scalar(w, key, GGUF_U16, &v, err);
}
int gguf_writer_set_i16(struct gguf_writer *w, const char *key, int16_t v, struct qerr *err)
{
    return set_scalar(w, key, GGUF_I16, &v, err);
}
int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v, struct qerr *err)
{
    return set_scalar(w, key, GGUF_U32, &v, err);
}
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v, struct qerr *err)
{
    return set_scalar(w, key, GGUF_I32, &v, err);
}
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v, struct qerr *err)
{
    return set_scalar(w, key, GGUF_U64, &v, err);
}
int gguf_writer_set_i64(struct gguf_writer *w, const char *key, int64_t v, struct qerr *err)
{
    return set_scalar(w, key, GGUF_I64, &v, err);
}
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v, struct qerr *err)
{
    return set_scalar(w, key, GGUF_F32, &v, err);
}
int gguf_writer_set_f64(struct gguf_writer *w, const char *key, double v, struct qerr *err)
{
    return set_scalar(w, key, GGUF_F64, &v, err);
}
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v, struct qerr *err)
{
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, key, GGUF_BOOL, &b, err);
}

int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *s, size_t len,
                        struct qerr *err)
{
    struct wbuf b = {0};
    wb_str(&b, s, len);
    return set_kv(w, key, GGUF_STRING, &b, err);
}

int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem,
                        const void *data, uint64_t n, struct qerr *err)
{
    size_t es = gguf_vtype_size(elem);
    if (!es)
        return qerr_set(err, QERR_INVALID,
                        "gguf writer: metadata '%s': array element type %s is not numeric", key,
                        gguf_vtype_name(elem));
    if (n > SIZE_MAX / es)
        return qerr_set(err, QERR_INVALID, "gguf writer: metadata '%s': array too large", key);
    struct wbuf b = {0};
    wb_u32(&b, elem);
    wb_u64(&b, n);
    wb_put(&b, data, (size_t)n * es);
    return set_kv(w, key, GGUF_ARRAY, &b, err);
}

int gguf_writer_set_str_arr(struct gguf_writer *w, const char *key, const struct gguf_str *strs,
                            uint64_t n, struct qerr *err)
{
    struct wbuf b = {0};
    wb_u32(&b, GGUF_STRING);
    wb_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) wb_str(&b, strs[i].ptr, strs[i].len);
    return set_kv(w, key, GGUF_ARRAY, &b, err);
}

int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_kv *kv, struct qerr *err)
{
    char *key = strndup(kv->key.ptr, (size_t)kv->key.len);
    if (!key) return qerr_set(err, QERR_NOMEM, "gguf writer: out of memory");
    int rc;
    if (strlen(key) != kv->key.len) {
        rc = qerr_set(err, QERR_INVALID, "gguf writer: metadata key '%s' holds a NUL byte", key);
    } else if (kv->type == GGUF_STRING) {
        rc = gguf_writer_set_str(w, key, kv->str.ptr, (size_t)kv->str.len, err);
    } else if (kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING) {
        rc = gguf_writer_set_str_arr(w, key, kv->strs, kv->arr_len, err);
    } else if (kv->type == GGUF_ARRAY) {
        rc = gguf_writer_set_arr(w, key, kv->arr_type, kv->value, kv->arr_len, err);
    } else if (gguf_vtype_size(kv->type)) {
        rc = set_scalar(w, key, kv->type, kv->value, err);
    } else {
        rc = qerr_set(err, QERR_INVALID, "gguf writer: metadata '%s' has unknown type %u", key,
                      (unsigned)kv->type);
    }
    free(key);
    return rc;
}

bool gguf_writer_remove(struct gguf_writer *w, const char *key)
{
    struct wkv *kv = find_kv(w, key);
    if (!kv) return false;
    free(kv->key);
    free(kv->val);
    uint64_t i = (uint64_t)(kv - w->kv);
    memmove(kv, kv + 1, (size_t)(w->n_kv - i - 1) * sizeof *kv);
    w->n_kv--;
    return true;
}

uint64_t gguf_writer_kv_count(const struct gguf_writer *w)
{
    return w->n_kv;
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t n_dims,
                           const uint64_t *ne, enum qtype type, struct qerr *err)
{
    size_t len = strlen(name);
    if (len == 0 || len > GGUF_NAME_MAX)
        return qerr_set(err, QERR_INVALID,
                        "gguf writer: tensor name '%.80s' is %zu bytes, want 1..%d", name, len,
                        GGUF_NAME_MAX);
    for (uint64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return qerr_set(err, QERR_INVALID, "gguf writer: tensor '%s' added twice", name);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return qerr_set(err, QERR_INVALID, "gguf writer: tensor '%s': n_dims %u not in 1..%d", name,
                        n_dims, GGUF_MAX_DIMS);
    if (!qtype_supported(type))
        return qerr_set(err, QERR_UNSUPPORTED, "gguf writer: tensor '%s': unsupported type %u",
                        name, (unsigned)type);
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || __builtin_mul_overflow(n, ne[d], &n) || n > (UINT64_C(1) << 50))
            return qerr_set(err, QERR_INVALID,
                            "gguf writer: tensor '%s': dimension %u (%llu) is zero or too large",
                            name, d, (unsigned long long)ne[d]);
    }
    size_t be = qtype_block_elems(type);
    if (ne[0] % be)
        return qerr_set(err, QERR_INVALID,
                        "gguf writer: tensor '%s': row length %llu is not a multiple of the %zu "
                        "elements of a %s block",
                        name, (unsigned long long)ne[0], be, qtype_name(type));
    if (w->n_t == w->cap_t) {
        uint64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        struct wtensor *p = realloc(w->t, cap * sizeof *p);
        if (!p) return qerr_set(err, QERR_NOMEM, "gguf writer: out of memory");
        w->t = p;
        w->cap_t = cap;
    }
    char *nm = strdup(name);
    if (!nm) return qerr_set(err, QERR_NOMEM, "gguf writer: out of memory");
    struct wtensor *t = &w->t[w->n_t++];
    *t = (struct wtensor){.name = nm, .n_dims = n_dims, .type = type};
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = n / ne[0] * qtype_row_bytes(type, (size_t)ne[0]);
    return 0;
}

uint64_t gguf_writer_tensor_count(const struct gguf_writer *w)
{
    return w->n_t;
}

size_t gguf_writer_tensor_bytes(const struct gguf_writer *w, uint64_t index)
{
    return index < w->n_t ? (size_t)w->t[index].nbytes : 0;
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static int get_alignment(const struct gguf_writer *w, uint64_t *out, struct qerr *err)
{
    *out = 32;
    const struct wkv *kv = find_kv(w, "general.alignment");
    if (!kv) return 0;
    uint32_t a = 0;
    if (kv->type == GGUF_U32) memcpy(&a, kv->val, 4);
    if (kv->type != GGUF_U32 || a < 8 || (a & (a - 1)))
        return qerr_set(err, QERR_INVALID,
                        "gguf writer: general.alignment must be a u32 power of two of at least 8");
    *out = a;
    return 0;
}

/* The header: magic, version, counts, key/values, tensor infos, padding to the alignment. */
static int build_header(const struct gguf_writer *w, uint64_t alignment, struct wbuf *b,
                        struct qerr *err)
{
    wb_put(b, "GGUF", 4);
    wb_u32(b, 3);
    wb_u64(b, w->n_t);
    wb_u64(b, w->n_kv);
    for (uint64_t i = 0; i < w->n_kv; i++) {
        wb_str(b, w->kv[i].key, strlen(w->kv[i].key));
        wb_u32(b, w->kv[i].type);
        wb_put(b, w->kv[i].val, w->kv[i].val_len);
    }
    uint64_t offset = 0;
    for (uint64_t i = 0; i < w->n_t; i++) {
        const struct wtensor *t = &w->t[i];
        wb_str(b, t->name, strlen(t->name));
        wb_u32(b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) wb_u64(b, t->ne[d]);
        wb_u32(b, (uint32_t)t->type);
        wb_u64(b, offset);
        offset = align_up(offset + t->nbytes, alignment);
    }
    static const unsigned char zeros[64];
    while (!b->oom && b->n % alignment) {
        size_t n = (size_t)(alignment - b->n % alignment);
        wb_put(b, zeros, n < sizeof zeros ? n : sizeof zeros);
    }
    return b->oom ? qerr_set(err, QERR_NOMEM, "gguf writer: out of memory for the header") : 0;
}

static ssize_t sys_write(void *ctx, int fd, const void *buf, size_t n)
{
    (void)ctx;
    return write(fd, buf, n);
}

static int sys_fsync(void *ctx, int fd)
{
    (void)ctx;
    return fsync(fd);
}

struct out {
    struct gguf_write_io io;
    int fd;
    const char *path; /* the destination, for messages */
    uint64_t written;
};

static int out_write(struct out *o, const void *buf, size_t n, struct qerr *err)
{
    const unsigned char *p = buf;
    while (n) {
        size_t chunk = n < ((size_t)1 << 30) ? n : (size_t)1 << 30;
        ssize_t k = o->io.write(o->io.ctx, o->fd, p, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return qerr_set(err, QERR_IO, "%s: write failed after %llu bytes: %s", o->path,
                            (unsigned long long)o->written,
                            k < 0 ? strerror(errno) : "no progress");
        p += k;
        n -= (size_t)k;
        o->written += (uint64_t)k;
    }
    return 0;
}

static int out_pad(struct out *o, uint64_t alignment, struct qerr *err)
{
    static const unsigned char zeros[256];
    uint64_t pad = align_up(o->written, alignment) - o->written;
    while (pad) {
        size_t n = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        int rc = out_write(o, zeros, n, err);
        if (rc) return rc;
        pad -= n;
    }
    return 0;
}

/* Header and every tensor's data, each tensor padded to the alignment. */
static int write_body(const struct gguf_writer *w, struct out *o, uint64_t alignment,
                      gguf_tensor_fill_fn fill, void *ctx, struct qerr *err)
{
    struct wbuf hdr = {0};
    int rc = build_header(w, alignment, &hdr, err);
    if (!rc) rc = out_write(o, hdr.p, hdr.n, err);
    free(hdr.p);
    if (rc) return rc;
    uint64_t max = 0;
    for (uint64_t i = 0; i < w->n_t; i++)
        if (w->t[i].nbytes > max) max = w->t[i].nbytes;
    if (w->n_t && !fill)
        return qerr_set(err, QERR_INVALID, "%s: tensors but no data callback", o->path);
    unsigned char *data = max ? malloc((size_t)max) : NULL;
    if (max && !data)
        return qerr_set(err, QERR_NOMEM, "%s: out of memory for a tensor of %llu bytes", o->path,
                        (unsigned long long)max);
    for (uint64_t i = 0; i < w->n_t && !rc; i++) {
        if ((rc = fill(ctx, i, data, (size_t)w->t[i].nbytes, err))) qerr_wrap(err, "%s", o->path);
        if (!rc) rc = out_write(o, data, (size_t)w->t[i].nbytes, err);
        if (!rc) rc = out_pad(o, alignment, err);
    }
    free(data);
    return rc;
}

/* fsync of the directory that holds path, so the rename itself is durable. Best effort: some
 * file systems refuse fsync on a directory, and the data is already in place. */
static void sync_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

int gguf_writer_write(struct gguf_writer *w, const char *path, gguf_tensor_fill_fn fill, void *ctx,
                      const struct gguf_write_io *io, struct qerr *err)
{
    uint64_t alignment;
    int rc = get_alignment(w, &alignment, err);
    if (rc) return qerr_wrap(err, "%s", path);
    static const char suffix[] = ".tmp.XXXXXX";
    size_t len = strlen(path);
    char *tmp = malloc(len + sizeof suffix);
    if (!tmp) return qerr_set(err, QERR_NOMEM, "%s: out of memory", path);
    memcpy(tmp, path, len);
    memcpy(tmp + len, suffix, sizeof suffix);
    struct out o = {.io = {sys_write, sys_fsync, NULL}, .path = path};
    if (io) {
        if (io->write) o.io.write = io->write;
        if (io->fsync) o.io.fsync = io->fsync;
        o.io.ctx = io->ctx;
    }
    o.fd = mkostemp(tmp, O_CLOEXEC);
    if (o.fd < 0) {
        rc = qerr_set(err, QERR_IO, "%s: cannot create a temporary file beside it: %s", path,
                      strerror(errno));
        free(tmp);
        return rc;
    }
    if (fchmod(o.fd, 0644) != 0)
        rc = qerr_set(err, QERR_IO, "%s: chmod of the temporary file failed: %s", path,
                      strerror(errno));
    if (!rc) rc = write_body(w, &o, alignment, fill, ctx, err);
    if (!rc && o.io.fsync(o.io.ctx, o.fd) != 0)
        rc = qerr_set(err, QERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (close(o.fd) != 0 && !rc)
        rc = qerr_set(err, QERR_IO, "%s: close failed: %s", path, strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = qerr_set(err, QERR_IO, "%s: cannot rename the temporary file into place: %s", path,
                      strerror(errno));
    if (rc) {
        unlink(tmp);
        if (err) {
            size_t n = strlen(err->msg);
            snprintf(err->msg + n, sizeof err->msg - n, " (nothing written)");
        }
    } else {
        sync_dir(path);
    }
    free(tmp);
    return rc;
}
