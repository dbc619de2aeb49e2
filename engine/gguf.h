/* gguf: a read-only, validating GGUF v3 reader over an mmap'd file.
 *
 * gguf_open checks every count, length, type, dimension, offset and the alignment against the
 * file size before anything reads through them; after it returns 0 every accessor below is a
 * bounds-safe lookup. A corrupt or truncated file gives one error naming the file and field.
 * Tensor data stays in the mapping (no copies); pointers stay valid until gguf_close. */
#ifndef QUERN_GGUF_H
#define QUERN_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../quant/qerr.h"
#include "../quant/qtypes.h"

enum gguf_vtype {
    GGUF_U8 = 0,
    GGUF_I8 = 1,
    GGUF_U16 = 2,
    GGUF_I16 = 3,
    GGUF_U32 = 4,
    GGUF_I32 = 5,
    GGUF_F32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_U64 = 10,
    GGUF_I64 = 11,
    GGUF_F64 = 12,
};

struct gguf_str {
    const char *ptr; /* not NUL-terminated: points into the mapping */
    uint64_t len;
};

struct gguf_kv {
    struct gguf_str key;
    enum gguf_vtype type;
    /* scalars: value points at the little-endian bytes; strings: str is set.
     * arrays: arr_type, arr_len; numeric arrays: value points at arr_len packed elements;
     * string arrays: strs[arr_len] (an index built at open). */
    const void *value;
    struct gguf_str str;
    enum gguf_vtype arr_type;
    uint64_t arr_len;
    struct gguf_str *strs;
};

#define GGUF_MAX_DIMS 4

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the fastest-varying (row length); unused dims are 1 */
    enum qtype type;
    uint64_t n_elems;
    uint64_t nbytes;
    const void *data;   /* inside the mapping, aligned to the file's alignment; or, for a type
                           converted at open (file_type), in memory the file owns, NULL once
                           released (gguf_tensor_release) */
    uint32_t file_type; /* the type in the file: type, or a qconv.h type read as type */
};

struct gguf_file;

int gguf_open(const char *path, struct gguf_file **out, struct qerr *err);
void gguf_close(struct gguf_file *f);

const char *gguf_path(const struct gguf_file *f);
uint32_t gguf_version(const struct gguf_file *f);
uint64_t gguf_file_size(const struct gguf_file *f);
/* Lets the kernel drop this process's pages of the file wholly inside [p, p + n): they stay
 * valid (a private read-only mapping) and fault back in if read. Memory outside the mapping (a
 * converted tensor, a caller's copy) is left alone. */
void gguf_drop_pages(const struct gguf_file *f, const void *p, size_t n);

/* A tensor's bytes in its type: t->data, or for a converted tensor that was released, a new
 * conversion of the file's bytes (the same bytes again). Safe from several threads. */
int gguf_tensor_bytes(const struct gguf_file *f, const struct gguf_tensor *t, const void **out,
                      struct qerr *err);
/* The caller is done with t's bytes (a backend packed its own copy). A converted tensor's copy
 * is freed (t->data becomes NULL until gguf_tensor_bytes makes it again); the file's own bytes
 * only lose their pages (gguf_drop_pages). Pointers into the freed copy must not be used. */
void gguf_tensor_release(const struct gguf_file *f, const struct gguf_tensor *t);

uint64_t gguf_kv_count(const struct gguf_file *f);
const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, uint64_t i);
const struct gguf_kv *gguf_kv_find(const struct gguf_file *f, const char *key); /* NULL if absent */

/* Typed accessors. Each returns 0, QERR_NOTFOUND when the key is absent, or QERR_FORMAT when the
 * value has a type that cannot be converted losslessly (err names the key and both types). Integer
 * getters accept any integer type whose value fits. */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out, struct qerr *err);
int gguf_get_i32(const struct gguf_file *f, const char *key, int32_t *out, struct qerr *err);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out, struct qerr *err);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, struct qerr *err);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out,
                 struct qerr *err);
/* An array whose elements all have type want (string arrays: use kv->strs). */
int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype want,
                 const struct gguf_kv **out, struct qerr *err);

uint64_t gguf_tensor_count(const struct gguf_file *f);
const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, uint64_t i);
const struct gguf_tensor *gguf_tensor_find(const struct gguf_file *f, const char *name);

bool gguf_str_eq(struct gguf_str s, const char *c);
const char *gguf_vtype_name(enum gguf_vtype t);
/* Bytes of one value of a scalar type; 0 for strings, arrays and unknown types. */
size_t gguf_vtype_size(uint32_t t);

#endif
