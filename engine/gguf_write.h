/* gguf_write: builds a GGUF v3 file (metadata of every value type, tensor infos, aligned tensor
 * data) and writes it atomically.
 *
 * A writer collects key/values and tensor infos in memory (each value is serialized to its
 * on-disk bytes when it is set, so the writer owns everything it holds), then gguf_writer_write
 * streams the file: header, key/values, tensor infos, padding to the alignment, then each
 * tensor's bytes, which a callback produces one tensor at a time, each padded to the alignment
 * (as ggml's writer does, so every offset is aligned).
 *
 * Atomicity: the bytes go to "PATH.tmp.XXXXXX" in the destination's directory, which is fsynced
 * and renamed over PATH only when everything was written; on any error (a failed write, ENOSPC,
 * a callback error) the temporary file is removed and PATH is left as it was. The directory is
 * fsynced after the rename. The new file gets mode 0644.
 *
 * The alignment is the u32 value of "general.alignment" when the writer holds that key (a power
 * of two), else 32. Setting a key that exists replaces its value in place (order is kept). */
#ifndef QUERN_GGUF_WRITE_H
#define QUERN_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gguf.h"

struct gguf_writer;

/* The system calls the writer makes, replaceable so a test can make a write fail (ENOSPC) at
 * any byte. NULL members, or a NULL io, mean write(2) and fsync(2). Each returns as the system
 * call does (-1 with errno set on failure). */
struct gguf_write_io {
    ssize_t (*write)(void *ctx, int fd, const void *buf, size_t n);
    int (*fsync)(void *ctx, int fd);
    void *ctx;
};

/* Fills dst with the nbytes of data of tensor index (in the order added). Returns 0 or a
 * negative QERR_* with err filled; the write then stops and removes its temporary file. */
typedef int (*gguf_tensor_fill_fn)(void *ctx, uint64_t index, void *dst, size_t nbytes,
                                   struct qerr *err);

int gguf_writer_init(struct gguf_writer **out, struct qerr *err);
void gguf_writer_free(struct gguf_writer *w);

/* Scalars. The key must be non-empty; err names it on failure (QERR_NOMEM, QERR_INVALID). */
int gguf_writer_set_u8(struct gguf_writer *w, const char *key, uint8_t v, struct qerr *err);
int gguf_writer_set_i8(struct gguf_writer *w, const char *key, int8_t v, struct qerr *err);
int gguf_writer_set_u16(struct gguf_writer *w, const char *key, uint16_t v, struct qerr *err);
int gguf_writer_set_i16(struct gguf_writer *w, const char *key, int16_t v, struct qerr *err);
int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v, struct qerr *err);
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v, struct qerr *err);
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v, struct qerr *err);
int gguf_writer_set_i64(struct gguf_writer *w, const char *key, int64_t v, struct qerr *err);
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v, struct qerr *err);
int gguf_writer_set_f64(struct gguf_writer *w, const char *key, double v, struct qerr *err);
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v, struct qerr *err);
/* A string of len bytes (need not be NUL-terminated). */
int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *s, size_t len,
                        struct qerr *err);
/* An array of n elements of numeric or bool type elem, packed little-endian at data. */
int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem,
                        const void *data, uint64_t n, struct qerr *err);
int gguf_writer_set_str_arr(struct gguf_writer *w, const char *key, const struct gguf_str *strs,
                            uint64_t n, struct qerr *err);
/* Copies one key/value as a reader returned it (any type the reader accepts). */
int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_kv *kv, struct qerr *err);
/* Removes a key; false when it was not there. */
bool gguf_writer_remove(struct gguf_writer *w, const char *key);
uint64_t gguf_writer_kv_count(const struct gguf_writer *w);

/* Adds a tensor info. ne[0] is the row length (fastest-varying); it must be a multiple of the
 * type's block. Names are 1..63 bytes (llama.cpp's limit) and unique; n_dims is 1..4; every
 * dimension is >= 1. err names the tensor. */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t n_dims,
                           const uint64_t *ne, enum qtype type, struct qerr *err);
uint64_t gguf_writer_tensor_count(const struct gguf_writer *w);
/* Bytes of the data of tensor index (before padding). */
size_t gguf_writer_tensor_bytes(const struct gguf_writer *w, uint64_t index);

/* Writes the file at path as described above. io may be NULL. err names path on failure. */
int gguf_writer_write(struct gguf_writer *w, const char *path, gguf_tensor_fill_fn fill, void *ctx,
                      const struct gguf_write_io *io, struct qerr *err);

#endif
