/* GGUF v3 reader. Design: one pass over the header with a cursor that refuses to step past the
 * end of the mapping; every length or count read from the file is checked against the bytes left
 * before it is used to size anything. After the pass, tensor infos are checked against the data
 * section (offset + size within the file, aligned), so no later access can leave the mapping. */
#include "gguf.h"

#include "../quant/fault.h"
#include "../quant/qconv.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct gguf_file {
    char *path;
    const uint8_t *map;
    uint64_t size;
    uint32_t version;
    uint64_t n_kv;
    struct gguf_kv *kv;
    uint64_t n_tensors;
    struct gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;
    /* Per tensor, for those of qconv.h types (NULL for the others): the bytes in the mapping,
     * and the copy in the target type (t->data), freed by gguf_tensor_release and made again
     * by gguf_tensor_bytes. The copies are a cache behind the file's const interface; conv_lock
     * guards them. */
    const uint8_t **conv_src;
    uint8_t **conv_mem;
    pthread_mutex_t conv_lock;
    bool conv_lock_made;
};

struct cursor {
    const struct gguf_file *f;
    uint64_t pos;
    struct qerr *err;
};

static int fail(struct cursor *c, const char *what)
{
    return qerr_set(c->err, QERR_FORMAT, "%s: corrupt GGUF: %s (at byte %llu of %llu)", c->f->path,
                    what, (unsigned long long)c->pos, (unsigned long long)c->f->size);
}

static int need(struct cursor *c, uint64_t n, const char *what)
{
    /* each header read touches the mapping: where a disk error would surface */
    if (fault_hit(FAULT_READ))
        return qerr_set(c->err, QERR_IO, "%s: %s: read error at byte %llu: %s", c->f->path, what,
                        (unsigned long long)c->pos, strerror(EIO));
    if (n > c->f->size - c->pos) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s: needs %llu bytes, file is truncated", what,
                 (unsigned long long)n);
        return fail(c, buf);
    }
    return 0;
}

static int read_bytes(struct cursor *c, void *dst, uint64_t n, const char *what)
{
    int rc = need(c, n, what);
    if (rc) return rc;
    memcpy(dst, c->f->map + c->pos, n);
    c->pos += n;
    return 0;
}

static int read_u32(struct cursor *c, uint32_t *v, const char *what)
{
    return read_bytes(c, v, 4, what);
}

static int read_u64(struct cursor *c, uint64_t *v, const char *what)
{
    return read_bytes(c, v, 8, what);
}

static int read_str(struct cursor *c, struct gguf_str *s, const char *what)
{
    int rc = read_u64(c, &s->len, what);
    if (rc) return rc;
    if ((rc = need(c, s->len, what))) return rc;
    s->ptr = (const char *)c->f->map + c->pos;
    c->pos += s->len;
    return 0;
}

size_t gguf_vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_U8:
    case GGUF_I8:
    case GGUF_BOOL:
        return 1;
    case GGUF_U16:
    case GGUF_I16:
        return 2;
    case GGUF_U32:
    case GGUF_I32:
    case GGUF_F32:
        return 4;
    case GGUF_U64:
    case GGUF_I64:
    case GGUF_F64:
        return 8;
    }
    return 0; /* string, array, or unknown */
}

const char *gguf_vtype_name(enum gguf_vtype t)
{
    static const char *names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

bool gguf_str_eq(struct gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

static int read_kv(struct cursor *c, struct gguf_kv *kv, uint64_t idx)
{
    char what[128];
    snprintf(what, sizeof what, "key of metadata entry %llu", (unsigned long long)idx);
    int rc = read_str(c, &kv->key, what);
    if (rc) return rc;
    /* from here on, errors name the key itself */
    snprintf(what, sizeof what, "metadata '%.*s'", (int)(kv->key.len > 80 ? 80 : kv->key.len),
             kv->key.ptr);
    uint32_t t;
    if ((rc = read_u32(c, &t, what))) return rc;
    kv->type = (enum gguf_vtype)t;
    if (t == GGUF_STRING) return read_str(c, &kv->str, what);
    if (t == GGUF_ARRAY) {
        uint32_t at;
        if ((rc = read_u32(c, &at, what))) return rc;
        if ((rc = read_u64(c, &kv->arr_len, what))) return rc;
        kv->arr_type = (enum gguf_vtype)at;
        if (at == GGUF_STRING) {
            /* each string needs at least its 8-byte length: bound the count before allocating */
            if (kv->arr_len > (c->f->size - c->pos) / 8) {
                char b[512];
                snprintf(b, sizeof b,
                         "%s: string array count %llu exceeds the file: truncated or corrupt", what,
                         (unsigned long long)kv->arr_len);
                return fail(c, b);
            }
            kv->strs = calloc(kv->arr_len ? kv->arr_len : 1, sizeof *kv->strs);
            if (!kv->strs) return qerr_set(c->err, QERR_NOMEM, "%s: out of memory", what);
            for (uint64_t i = 0; i < kv->arr_len; i++)
                if ((rc = read_str(c, &kv->strs[i], what))) return rc;
            return 0;
        }
        uint64_t es = gguf_vtype_size(at);
        if (!es) {
            char b[512];
            snprintf(b, sizeof b, "%s: unsupported array element type %u", what, at);
            return fail(c, b);
        }
        if (kv->arr_len > (c->f->size - c->pos) / es) {
            char b[512];
            snprintf(b, sizeof b,
                     "%s: array of %llu elements exceeds the file: truncated or corrupt", what,
                     (unsigned long long)kv->arr_len);
            return fail(c, b);
        }
        kv->value = c->f->map + c->pos;
        c->pos += kv->arr_len * es;
        return 0;
    }
    uint64_t sz = gguf_vtype_size(t);
    if (!sz) {
        char b[512];
        snprintf(b, sizeof b, "%s: unknown value type %u", what, t);
        return fail(c, b);
    }
    if ((rc = need(c, sz, what))) return rc;
    kv->value = c->f->map + c->pos;
    c->pos += sz;
    return 0;
}

static int read_tensor_info(struct cursor *c, struct gguf_tensor *t, uint64_t idx, uint64_t *offset)
{
    char what[160];
    snprintf(what, sizeof what, "name of tensor %llu", (unsigned long long)idx);
    int rc = read_str(c, &t->name, what);
    if (rc) return rc;
    snprintf(what, sizeof what, "tensor '%.*s'", (int)(t->name.len > 80 ? 80 : t->name.len),
             t->name.ptr);
    if ((rc = read_u32(c, &t->n_dims, what))) return rc;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS) {
        char b[512];
        snprintf(b, sizeof b, "%s: n_dims %u not in 1..%d", what, t->n_dims, GGUF_MAX_DIMS);
        return fail(c, b);
    }
    t->n_elems = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if ((rc = read_u64(c, &t->ne[d], what))) return rc;
        if (t->ne[d] == 0 || t->ne[d] > ((uint64_t)1 << 40) ||
            t->n_elems > ((uint64_t)1 << 50) / t->ne[d]) {
            char b[512];
            snprintf(b, sizeof b, "%s: dimension %u is %llu", what, d,
                     (unsigned long long)t->ne[d]);
            return fail(c, b);
        }
        t->n_elems *= t->ne[d];
    }
    uint32_t type;
    if ((rc = read_u32(c, &type, what))) return rc;
    if ((rc = read_u64(c, offset, what))) return rc;
    bool conv = qconv_type(type);
    if (!qtype_supported(type) && !conv)
        return qerr_set(c->err, QERR_UNSUPPORTED,
                        "%s: %s has unsupported tensor type %u (quern reads F32, F16, BF16, "
                        "Q8_0, Q4_0, Q4_1, and converts Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)",
                        c->f->path, what, type);
    t->file_type = type;
    t->type = conv ? qconv_target(type) : (enum qtype)type;
    size_t be = conv ? qconv_block_elems(type) : qtype_block_elems(t->type);
    if (t->ne[0] % be) {
        char b[512];
        snprintf(b, sizeof b, "%s: row length %llu is not a multiple of the %s block (%zu)", what,
                 (unsigned long long)t->ne[0], conv ? qconv_name(type) : qtype_name(type), be);
        return fail(c, b);
    }
    /* the bytes in the file; a converted tensor's own size is set when it is converted */
    t->nbytes = t->n_elems / be * (conv ? qconv_block_bytes(type) : qtype_block_bytes(t->type));
    return 0;
}

/* A piece of one tensor's conversion: elements [first, first + count) of tensor `tensor`. */
struct conv_piece {
    uint64_t tensor, first, count;
};

/* The conversions of one call, shared by the threads that run them. */
struct conv_job {
    const struct gguf_file *f;
    const struct conv_piece *pieces;
    size_t n_pieces;
    atomic_size_t next;
};

/* Elements a piece: a multiple of every converted type's block, small enough that a file's big
 * tensors (the output matrix) spread over the threads. */
#define CONV_PIECE       ((uint64_t)1 << 20)
#define CONV_THREADS_MAX 32

static void *conv_worker(void *arg)
{
    struct conv_job *j = arg;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n_pieces;) {
        const struct conv_piece *p = &j->pieces[i];
        const struct gguf_tensor *t = &j->f->tensors[p->tensor];
        uint64_t be = qconv_block_elems(t->file_type);
        const uint8_t *src =
            j->f->conv_src[p->tensor] + p->first / be * qconv_block_bytes(t->file_type);
        uint8_t *out = j->f->conv_mem[p->tensor] + qtype_row_bytes(t->type, p->first);
        qconv_row(t->file_type, src, out, p->count);
    }
    return NULL;
}

static bool is_converted(const struct gguf_file *f, uint64_t i)
{
    return f->conv_src && f->conv_src[i];
}

/* Converts tensors [lo, hi) of qconv.h types that have no copy yet into new copies (64-byte
 * aligned), in pieces over as many threads as the machine has cores: a requantized element costs
 * about 4 ns, half a minute for an 8B model's on one core. */
static int convert_range(struct gguf_file *f, uint64_t lo, uint64_t hi, struct qerr *err)
{
    size_t n_pieces = 0;
    for (uint64_t i = lo; i < hi; i++) {
        if (!is_converted(f, i) || f->conv_mem[i]) continue;
        const struct gguf_tensor *t = &f->tensors[i];
        size_t bytes = qtype_row_bytes(t->type, t->n_elems);
        f->conv_mem[i] = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        if (!f->conv_mem[i])
            return qerr_set(err, QERR_NOMEM,
                            "%s: out of memory converting tensor '%.*s' (%zu bytes)", f->path,
                            (int)(t->name.len > 64 ? 64 : t->name.len), t->name.ptr, bytes);
        n_pieces += (t->n_elems + CONV_PIECE - 1) / CONV_PIECE;
    }
    if (!n_pieces) return 0;
    struct conv_piece *pieces = malloc(n_pieces * sizeof *pieces);
    if (!pieces) return qerr_set(err, QERR_NOMEM, "%s: out of memory converting tensors", f->path);
    size_t np = 0;
    for (uint64_t i = lo; i < hi; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        if (!is_converted(f, i) || t->data) continue; /* converted before this call */
        for (uint64_t e = 0; e < t->n_elems; e += CONV_PIECE)
            pieces[np++] = (struct conv_piece){
                i, e, t->n_elems - e < CONV_PIECE ? t->n_elems - e : CONV_PIECE};
    }
    struct conv_job job = {.f = f, .pieces = pieces, .n_pieces = np};
    atomic_init(&job.next, 0);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n_threads = cores < 1 ? 1 : (size_t)cores;
    if (n_threads > np) n_threads = np;
    if (n_threads > CONV_THREADS_MAX) n_threads = CONV_THREADS_MAX;
    pthread_t th[CONV_THREADS_MAX];
    size_t started = 0;
    /* the caller is one of them; a thread that cannot start leaves its pieces to the others */
    while (started + 1 < n_threads && pthread_create(&th[started], NULL, conv_worker, &job) == 0)
        started++;
    conv_worker(&job);
    for (size_t i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (uint64_t i = lo; i < hi; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        if (!is_converted(f, i) || t->data) continue;
        t->data = f->conv_mem[i];
        /* read for now: its pages go until a release asks for the tensor again */
        gguf_drop_pages(f, f->conv_src[i],
                        t->n_elems / qconv_block_elems(t->file_type) *
                            qconv_block_bytes(t->file_type));
    }
    free(pieces);
    return 0;
}

/* Every tensor of a qconv.h type, rewritten in its target type at open. */
static int convert_tensors(struct gguf_file *f, struct qerr *err)
{
    bool any = false;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        any |= f->tensors[i].file_type != (uint32_t)f->tensors[i].type;
    if (!any) return 0;
    f->conv_src = calloc(f->n_tensors, sizeof *f->conv_src);
    f->conv_mem = calloc(f->n_tensors, sizeof *f->conv_mem);
    if (!f->conv_src || !f->conv_mem)
        return qerr_set(err, QERR_NOMEM, "%s: out of memory converting its tensors", f->path);
    if (pthread_mutex_init(&f->conv_lock, NULL) != 0)
        return qerr_set(err, QERR_NOMEM, "%s: cannot make a lock", f->path);
    f->conv_lock_made = true;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        if (t->file_type == (uint32_t)t->type) continue;
        f->conv_src[i] = t->data;
        t->data = NULL;
        t->nbytes = qtype_row_bytes(t->type, t->n_elems);
    }
    return convert_range(f, 0, f->n_tensors, err);
}

int gguf_tensor_bytes(const struct gguf_file *cf, const struct gguf_tensor *ct, const void **out,
                      struct qerr *err)
{
    *out = ct->data;
    if (ct->data) return 0;
    struct gguf_file *f = (struct gguf_file *)cf; /* its cache of converted copies */
    uint64_t i = (uint64_t)(ct - f->tensors);
    if (i >= f->n_tensors || !is_converted(f, i))
        return qerr_set(err, QERR_INVALID, "%s: tensor '%.*s' has no bytes", f->path,
                        (int)(ct->name.len > 64 ? 64 : ct->name.len), ct->name.ptr);
    pthread_mutex_lock(&f->conv_lock);
    int rc = convert_range(f, i, i + 1, err);
    *out = f->tensors[i].data;
    pthread_mutex_unlock(&f->conv_lock);
    return rc;
}

void gguf_tensor_release(const struct gguf_file *cf, const struct gguf_tensor *ct)
{
    struct gguf_file *f = (struct gguf_file *)cf;
    uint64_t i = (uint64_t)(ct - f->tensors);
    if (i >= f->n_tensors) return;
    if (!is_converted(f, i)) {
        gguf_drop_pages(f, ct->data, ct->nbytes);
        return;
    }
    pthread_mutex_lock(&f->conv_lock);
    free(f->conv_mem[i]);
    f->conv_mem[i] = NULL;
    f->tensors[i].data = NULL;
    pthread_mutex_unlock(&f->conv_lock);
}

static int parse(struct gguf_file *f, struct qerr *err)
{
    struct cursor c = {.f = f, .pos = 0, .err = err};
    char magic[4];
    int rc = read_bytes(&c, magic, 4, "magic");
    if (rc) return rc;
    if (memcmp(magic, "GGUF", 4) != 0)
        return qerr_set(err, QERR_FORMAT, "%s: not a GGUF file (bad magic)", f->path);
    if ((rc = read_u32(&c, &f->version, "version"))) return rc;
    if (f->version != 2 && f->version != 3)
        return qerr_set(err, QERR_UNSUPPORTED, "%s: GGUF version %u (quern reads 2 and 3)", f->path,
                        f->version);
    if ((rc = read_u64(&c, &f->n_tensors, "tensor count"))) return rc;
    if ((rc = read_u64(&c, &f->n_kv, "metadata count"))) return rc;
    /* a key/value needs >= 12 bytes and a tensor info >= 24: bound counts before allocating */
    if (f->n_kv > (f->size - c.pos) / 12)
        return fail(&c, "metadata count exceeds the file: truncated or corrupt");
    if (f->n_tensors > (f->size - c.pos) / 24)
        return fail(&c, "tensor count exceeds the file: truncated or corrupt");

    f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors) return qerr_set(err, QERR_NOMEM, "%s: out of memory", f->path);
    for (uint64_t i = 0; i < f->n_kv; i++)
        if ((rc = read_kv(&c, &f->kv[i], i))) return rc;

    f->alignment = 32;
    const struct gguf_kv *al = gguf_kv_find(f, "general.alignment");
    if (al) {
        uint32_t a;
        if (al->type != GGUF_U32)
            return qerr_set(err, QERR_FORMAT, "%s: general.alignment has type %s, want u32",
                            f->path, gguf_vtype_name(al->type));
        memcpy(&a, al->value, 4);
        /* the GGUF spec's rule: a multiple of 8, which keeps every tensor's fp16 and f32
         * fields aligned in the mapping (an odd one put a Q5_1 block's scale at an odd address) */
        if (a < 8 || (a & (a - 1)))
            return qerr_set(err, QERR_FORMAT,
                            "%s: general.alignment %u is not a power of two of at least 8", f->path,
                            a);
        f->alignment = a;
    }

    uint64_t *offsets = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *offsets);
    if (!offsets) return qerr_set(err, QERR_NOMEM, "%s: out of memory", f->path);
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++)
        rc = read_tensor_info(&c, &f->tensors[i], i, &offsets[i]);
    if (!rc) {
        f->data_offset = (c.pos + f->alignment - 1) / f->alignment * f->alignment;
        if (f->data_offset > f->size && f->n_tensors)
            rc = fail(&c, "data section starts past the end of the file");
    }
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        int nl = (int)(t->name.len > 80 ? 80 : t->name.len);
        if (offsets[i] % f->alignment)
            rc = qerr_set(err, QERR_FORMAT, "%s: tensor '%.*s': offset %llu is not aligned to %llu",
                          f->path, nl, t->name.ptr, (unsigned long long)offsets[i],
                          (unsigned long long)f->alignment);
        else if (offsets[i] > f->size - f->data_offset ||
                 t->nbytes > f->size - f->data_offset - offsets[i])
            rc = qerr_set(err, QERR_FORMAT,
                          "%s: tensor '%.*s': data [%llu, +%llu) runs past the end of the file "
                          "(%llu bytes): truncated?",
                          f->path, nl, t->name.ptr,
                          (unsigned long long)(f->data_offset + offsets[i]),
                          (unsigned long long)t->nbytes, (unsigned long long)f->size);
        else
            t->data = f->map + f->data_offset + offsets[i];
    }
    free(offsets);
    if (!rc) rc = convert_tensors(f, err);
    return rc;
}

int gguf_open(const char *path, struct gguf_file **out, struct qerr *err)
{
    *out = NULL;
    struct gguf_file *f = calloc(1, sizeof *f);
    if (!f) return qerr_set(err, QERR_NOMEM, "%s: out of memory", path);
    f->path = strdup(path);
    if (!f->path) {
        free(f);
        return qerr_set(err, QERR_NOMEM, "%s: out of memory", path);
    }
    int rc = 0;
    int fd = fault_hit(FAULT_READ) ? (errno = EIO, -1) : open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        rc = qerr_set(err, QERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto done;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = qerr_set(err, QERR_IO, "%s: not a regular file", path);
        goto done;
    }
    f->size = (uint64_t)st.st_size;
    if (f->size < 24) {
        rc = qerr_set(err, QERR_FORMAT, "%s: %llu bytes is too small for a GGUF header", path,
                      (unsigned long long)f->size);
        goto done;
    }
    void *m = fault_hit(FAULT_READ) ? (errno = EIO, MAP_FAILED)
                                    : mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        rc = qerr_set(err, QERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        goto done;
    }
    f->map = m;
    rc = parse(f, err);
done:
    if (fd >= 0) close(fd);
    if (rc) {
        gguf_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

void gguf_close(struct gguf_file *f)
{
    if (!f) return;
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++) free(f->kv[i].strs);
    free(f->kv);
    free(f->tensors);
    if (f->map) munmap((void *)f->map, f->size);
    for (uint64_t i = 0; f->conv_mem && i < f->n_tensors; i++) free(f->conv_mem[i]);
    free(f->conv_mem);
    free(f->conv_src);
    if (f->conv_lock_made) pthread_mutex_destroy(&f->conv_lock);
    free(f->path);
    free(f);
}

const char *gguf_path(const struct gguf_file *f)
{
    return f->path;
}
uint32_t gguf_version(const struct gguf_file *f)
{
    return f->version;
}
uint64_t gguf_file_size(const struct gguf_file *f)
{
    return f->size;
}
void gguf_drop_pages(const struct gguf_file *f, const void *p, size_t n)
{
    const uint8_t *b = p;
    if (!f->map || b < f->map || b >= f->map + f->size) return; /* madvise would zero it */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)b + page - 1) & ~(page - 1), hi = ((uintptr_t)b + n) & ~(page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED); /* a hint: failure costs only RSS */
}
uint64_t gguf_kv_count(const struct gguf_file *f)
{
    return f->n_kv;
}
const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, uint64_t i)
{
    return i < f->n_kv ? &f->kv[i] : NULL;
}
uint64_t gguf_tensor_count(const struct gguf_file *f)
{
    return f->n_tensors;
}
const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, uint64_t i)
{
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const struct gguf_kv *gguf_kv_find(const struct gguf_file *f, const char *key)
{
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

const struct gguf_tensor *gguf_tensor_find(const struct gguf_file *f, const char *name)
{
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (gguf_str_eq(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

static int lookup(const struct gguf_file *f, const char *key, const struct gguf_kv **kv,
                  struct qerr *err)
{
    *kv = gguf_kv_find(f, key);
    if (!*kv) return qerr_set(err, QERR_NOTFOUND, "%s: missing metadata key '%s'", f->path, key);
    return 0;
}

static int wrong_type(const struct gguf_file *f, const char *key, const struct gguf_kv *kv,
                      const char *want, struct qerr *err)
{
    return qerr_set(err, QERR_FORMAT, "%s: metadata '%s' has type %s, want %s", f->path, key,
                    gguf_vtype_name(kv->type), want);
}

/* Reads any integer-typed value as a sign and a magnitude, so no type's range is lost. */
static bool int_value(const struct gguf_kv *kv, bool *neg, uint64_t *mag)
{
    const void *p = kv->value;
    int64_t s = 0;
    uint64_t u = 0;
    bool is_signed = true;
    switch (kv->type) {
    case GGUF_U8:
        u = *(const uint8_t *)p, is_signed = false;
        break;
    case GGUF_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        u = v;
        is_signed = false;
        break;
    }
    case GGUF_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        u = v;
        is_signed = false;
        break;
    }
    case GGUF_U64:
        memcpy(&u, p, 8), is_signed = false;
        break;
    case GGUF_I8:
        s = *(const int8_t *)p;
        break;
    case GGUF_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        s = v;
        break;
    }
    case GGUF_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        s = v;
        break;
    }
    case GGUF_I64:
        memcpy(&s, p, 8);
        break;
    default:
        return false;
    }
    if (is_signed) {
        *neg = s < 0;
        *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    } else {
        *neg = false;
        *mag = u;
    }
    return true;
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out, struct qerr *err)
{
    const struct gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    bool neg;
    uint64_t mag;
    if (!int_value(kv, &neg, &mag)) return wrong_type(f, key, kv, "an integer", err);
    if (neg || mag > UINT32_MAX)
        return qerr_set(err, QERR_FORMAT, "%s: metadata '%s' = %s%llu does not fit u32", f->path,
                        key, neg ? "-" : "", (unsigned long long)mag);
    *out = (uint32_t)mag;
    return 0;
}

int gguf_get_i32(const struct gguf_file *f, const char *key, int32_t *out, struct qerr *err)
{
    const struct gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    bool neg;
    uint64_t mag;
    if (!int_value(kv, &neg, &mag)) return wrong_type(f, key, kv, "an integer", err);
    if (mag > (neg ? (uint64_t)INT32_MAX + 1 : (uint64_t)INT32_MAX))
        return qerr_set(err, QERR_FORMAT, "%s: metadata '%s' does not fit i32", f->path, key);
    *out = neg ? (int32_t)(0 - (int64_t)mag) : (int32_t)mag;
    return 0;
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *out, struct qerr *err)
{
    const struct gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    if (kv->type == GGUF_F32) {
        memcpy(out, kv->value, 4);
        return 0;
    }
    if (kv->type == GGUF_F64) {
        double d;
        memcpy(&d, kv->value, 8);
        *out = (float)d;
        return 0;
    }
    bool neg;
    uint64_t mag;
    if (!int_value(kv, &neg, &mag)) return wrong_type(f, key, kv, "a number", err);
    *out = neg ? -(float)mag : (float)mag;
    return 0;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, struct qerr *err)
{
    const struct gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    if (kv->type != GGUF_BOOL) return wrong_type(f, key, kv, "bool", err);
    *out = *(const uint8_t *)kv->value != 0;
    return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out, struct qerr *err)
{
    const struct gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    if (kv->type != GGUF_STRING) return wrong_type(f, key, kv, "string", err);
    *out = kv->str;
    return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype want,
                 const struct gguf_kv **out, struct qerr *err)
{
    const struct gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    if (kv->type != GGUF_ARRAY || kv->arr_type != want)
        return qerr_set(
            err, QERR_FORMAT, "%s: metadata '%s' has type %s%s%s, want array of %s", f->path, key,
            gguf_vtype_name(kv->type), kv->type == GGUF_ARRAY ? " of " : "",
            kv->type == GGUF_ARRAY ? gguf_vtype_name(kv->arr_type) : "", gguf_vtype_name(want));
    *out = kv;
    return 0;
}
