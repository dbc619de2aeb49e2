/* GGUF writer (engine/gguf_write.h) and model requantization (engine/gguf_quantize.h): files
 * written here are read back with quern's validating reader; every failure (a write that hits
 * ENOSPC at any byte, /dev/full, a failed fsync, a failing data callback, a bad shape) must leave
 * no file behind and keep an existing destination intact. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/gguf.h"
#include "../engine/gguf_quantize.h"
#include "../engine/gguf_write.h"
#include "../quant/quantize.h"
#include "testutil.h"

/* A fresh directory for one test's files; dir_free removes it and everything in it. */
static char *dir_new(void)
{
    char *d = strdup("/tmp/quern-gw-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d));
    return d;
}

/* Names in dir, joined by spaces (sorted by readdir order: tests use at most one file). */
static int dir_count(const char *dir, char *names, size_t cap)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    names[0] = '\0';
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        n++;
        size_t l = strlen(names);
        snprintf(names + l, cap - l, "%s ", e->d_name);
    }
    closedir(d);
    return n;
}

static void dir_free(char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[512];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

static char *path_in(const char *dir, const char *name)
{
    char *p;
    ck_assert_int_ge(asprintf(&p, "%s/%s", dir, name), 0);
    return p;
}

/* Tensor data for the writer tests: byte k of tensor i is (i * 31 + k) mod 256. */
static int fill_pattern(void *ctx, uint64_t index, void *dst, size_t nbytes, struct qerr *err)
{
    (void)ctx;
    (void)err;
    unsigned char *p = dst;
    for (size_t k = 0; k < nbytes; k++) p[k] = (unsigned char)(index * 31 + k);
    return 0;
}

static const char *str_arr[] = {"a", "", "ccc"};

/* A writer with metadata of every type and four tensors of different types and ranks. */
static struct gguf_writer *writer_full(uint32_t alignment)
{
    struct gguf_writer *w;
    struct qerr err = {0};
    ck_assert_int_eq(gguf_writer_init(&w, &err), 0);
    ck_assert_int_eq(gguf_writer_set_str(w, "general.architecture", "llama", 5, &err), 0);
    ck_assert_int_eq(gguf_writer_set_u8(w, "t.u8", 200, &err), 0);
    ck_assert_int_eq(gguf_writer_set_i8(w, "t.i8", -5, &err), 0);
    ck_assert_int_eq(gguf_writer_set_u16(w, "t.u16", 60000, &err), 0);
    ck_assert_int_eq(gguf_writer_set_i16(w, "t.i16", -30000, &err), 0);
    ck_assert_int_eq(gguf_writer_set_u32(w, "t.u32", 4000000000u, &err), 0);
    ck_assert_int_eq(gguf_writer_set_i32(w, "t.i32", -2000000000, &err), 0);
    ck_assert_int_eq(gguf_writer_set_u64(w, "t.u64", UINT64_C(1) << 40, &err), 0);
    ck_assert_int_eq(gguf_writer_set_i64(w, "t.i64", -(INT64_C(1) << 40), &err), 0);
    ck_assert_int_eq(gguf_writer_set_f32(w, "t.f32", 1.5f, &err), 0);
    ck_assert_int_eq(gguf_writer_set_f64(w, "t.f64", -2.25, &err), 0);
    ck_assert_int_eq(gguf_writer_set_bool(w, "t.bool", true, &err), 0);
    ck_assert_int_eq(gguf_writer_set_str(w, "t.empty", "", 0, &err), 0);
    int32_t ia[3] = {1, -2, 3};
    ck_assert_int_eq(gguf_writer_set_arr(w, "t.arr_i32", GGUF_I32, ia, 3, &err), 0);
    ck_assert_int_eq(gguf_writer_set_arr(w, "t.arr_empty", GGUF_F32, NULL, 0, &err), 0);
    struct gguf_str s[3];
    for (int i = 0; i < 3; i++) s[i] = (struct gguf_str){str_arr[i], strlen(str_arr[i])};
    ck_assert_int_eq(gguf_writer_set_str_arr(w, "t.strs", s, 3, &err), 0);
    ck_assert_int_eq(gguf_writer_set_str_arr(w, "t.strs_empty", s, 0, &err), 0);
    if (alignment)
        ck_assert_int_eq(gguf_writer_set_u32(w, "general.alignment", alignment, &err), 0);
    uint64_t a[] = {5}, b[] = {64, 3}, c[] = {2, 3, 4}, d[] = {32, 1};
    ck_assert_int_eq(gguf_writer_add_tensor(w, "a", 1, a, QTYPE_F32, &err), 0);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "b", 2, b, QTYPE_Q8_0, &err), 0);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "c", 3, c, QTYPE_F16, &err), 0);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "d", 2, d, QTYPE_Q4_1, &err), 0);
    return w;
}

static void check_scalar(const struct gguf_file *f, const char *key, enum gguf_vtype t,
                         const void *v, size_t n)
{
    const struct gguf_kv *kv = gguf_kv_find(f, key);
    ck_assert_msg(kv != NULL, "missing %s", key);
    ck_assert_int_eq(kv->type, t);
    ck_assert_mem_eq(kv->value, v, n);
}

START_TEST(all_types_roundtrip)
{
    char *dir = dir_new(), *path = path_in(dir, "out.gguf");
    struct gguf_writer *w = writer_full(64);
    struct qerr err = {0};
    ck_assert_uint_eq(gguf_writer_tensor_bytes(w, 1), 3 * 2 * 34);
    ck_assert_int_eq(gguf_writer_write(w, path, fill_pattern, NULL, NULL, &err), 0);
    gguf_writer_free(w);
    char names[256];
    ck_assert_int_eq(dir_count(dir, names, sizeof names), 1); /* no temporary file left */

    struct gguf_file *f;
    ck_assert_msg(gguf_open(path, &f, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(gguf_version(f), 3);
    ck_assert_uint_eq(gguf_kv_count(f), 18);
    ck_assert_uint_eq(gguf_file_size(f) % 64, 0); /* the last tensor is padded too */
    uint8_t u8 = 200;
    int8_t i8 = -5;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    uint32_t u32 = 4000000000u;
    int32_t i32 = -2000000000;
    uint64_t u64 = UINT64_C(1) << 40;
    int64_t i64 = -(INT64_C(1) << 40);
    float f32 = 1.5f;
    double f64 = -2.25;
    uint8_t bl = 1;
    check_scalar(f, "t.u8", GGUF_U8, &u8, 1);
    check_scalar(f, "t.i8", GGUF_I8, &i8, 1);
    check_scalar(f, "t.u16", GGUF_U16, &u16, 2);
    check_scalar(f, "t.i16", GGUF_I16, &i16, 2);
    check_scalar(f, "t.u32", GGUF_U32, &u32, 4);
    check_scalar(f, "t.i32", GGUF_I32, &i32, 4);
    check_scalar(f, "t.u64", GGUF_U64, &u64, 8);
    check_scalar(f, "t.i64", GGUF_I64, &i64, 8);
    check_scalar(f, "t.f32", GGUF_F32, &f32, 4);
    check_scalar(f, "t.f64", GGUF_F64, &f64, 8);
    check_scalar(f, "t.bool", GGUF_BOOL, &bl, 1);
    struct gguf_str s;
    ck_assert_int_eq(gguf_get_str(f, "general.architecture", &s, &err), 0);
    ck_assert(gguf_str_eq(s, "llama"));
    ck_assert_int_eq(gguf_get_str(f, "t.empty", &s, &err), 0);
    ck_assert_uint_eq(s.len, 0);
    const struct gguf_kv *kv;
    ck_assert_int_eq(gguf_get_arr(f, "t.arr_i32", GGUF_I32, &kv, &err), 0);
    ck_assert_uint_eq(kv->arr_len, 3);
    int32_t ia[3] = {1, -2, 3};
    ck_assert_mem_eq(kv->value, ia, sizeof ia);
    ck_assert_int_eq(gguf_get_arr(f, "t.arr_empty", GGUF_F32, &kv, &err), 0);
    ck_assert_uint_eq(kv->arr_len, 0);
    ck_assert_int_eq(gguf_get_arr(f, "t.strs", GGUF_STRING, &kv, &err), 0);
    ck_assert_uint_eq(kv->arr_len, 3);
    for (int i = 0; i < 3; i++) ck_assert(gguf_str_eq(kv->strs[i], str_arr[i]));
    ck_assert_int_eq(gguf_get_arr(f, "t.strs_empty", GGUF_STRING, &kv, &err), 0);
    ck_assert_uint_eq(kv->arr_len, 0);
    /* order of keys is the order they were set */
    ck_assert(gguf_str_eq(gguf_kv_at(f, 0)->key, "general.architecture"));

    ck_assert_uint_eq(gguf_tensor_count(f), 4);
    const char *tn[] = {"a", "b", "c", "d"};
    const enum qtype tt[] = {QTYPE_F32, QTYPE_Q8_0, QTYPE_F16, QTYPE_Q4_1};
    const uint64_t bytes[] = {20, 204, 48, 20};
    const unsigned char *base = gguf_tensor_at(f, 0)->data;
    for (uint64_t i = 0; i < 4; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        ck_assert(gguf_str_eq(t->name, tn[i]));
        ck_assert_int_eq(t->type, tt[i]);
        ck_assert_uint_eq(t->nbytes, bytes[i]);
        ck_assert_uint_eq((uint64_t)((const unsigned char *)t->data - base) % 64, 0);
        const unsigned char *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++) ck_assert_uint_eq(p[k], (unsigned char)(i * 31 + k));
    }
    ck_assert_uint_eq(gguf_tensor_find(f, "c")->ne[2], 4);
    ck_assert_uint_eq(gguf_tensor_find(f, "c")->n_dims, 3);
    gguf_close(f);
    free(path);
    dir_free(dir);
}
END_TEST

START_TEST(default_alignment_and_copy)
{
    /* no general.alignment: 32; then every key copied from the file into a second writer */
    char *dir = dir_new(), *p1 = path_in(dir, "a.gguf"), *p2 = path_in(dir, "b.gguf");
    struct gguf_writer *w = writer_full(0);
    struct qerr err = {0};
    ck_assert_int_eq(gguf_writer_write(w, p1, fill_pattern, NULL, NULL, &err), 0);
    gguf_writer_free(w);
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open(p1, &f, &err), 0);
    ck_assert_uint_eq(gguf_file_size(f) % 32, 0);
    ck_assert_int_eq(gguf_writer_init(&w, &err), 0);
    for (uint64_t i = 0; i < gguf_kv_count(f); i++)
        ck_assert_int_eq(gguf_writer_copy_kv(w, gguf_kv_at(f, i), &err), 0);
    ck_assert_uint_eq(gguf_writer_kv_count(w), gguf_kv_count(f));
    ck_assert_int_eq(gguf_writer_write(w, p2, NULL, NULL, NULL, &err), 0);
    gguf_writer_free(w);
    struct gguf_file *g;
    ck_assert_int_eq(gguf_open(p2, &g, &err), 0);
    ck_assert_uint_eq(gguf_kv_count(g), gguf_kv_count(f));
    ck_assert_uint_eq(gguf_tensor_count(g), 0);
    const struct gguf_kv *kv;
    ck_assert_int_eq(gguf_get_arr(g, "t.strs", GGUF_STRING, &kv, &err), 0);
    ck_assert(gguf_str_eq(kv->strs[2], "ccc"));
    double f64;
    memcpy(&f64, gguf_kv_find(g, "t.f64")->value, 8);
    ck_assert_double_eq(f64, -2.25);
    gguf_close(g);
    gguf_close(f);
    free(p1);
    free(p2);
    dir_free(dir);
}
END_TEST

START_TEST(replace_and_remove)
{
    char *dir = dir_new(), *path = path_in(dir, "out.gguf");
    struct gguf_writer *w;
    struct qerr err = {0};
    ck_assert_int_eq(gguf_writer_init(&w, &err), 0);
    ck_assert_int_eq(gguf_writer_set_u32(w, "k", 1, &err), 0);
    ck_assert_int_eq(gguf_writer_set_str(w, "j", "x", 1, &err), 0);
    ck_assert_int_eq(gguf_writer_set_str(w, "k", "two", 3, &err), 0); /* replaced, type too */
    ck_assert_uint_eq(gguf_writer_kv_count(w), 2);
    ck_assert(gguf_writer_remove(w, "j"));
    ck_assert(!gguf_writer_remove(w, "zz"));
    ck_assert_int_eq(gguf_writer_set_u32(w, "", 1, &err), QERR_INVALID);
    ck_assert_int_eq(gguf_writer_write(w, path, NULL, NULL, NULL, &err), 0);
    gguf_writer_free(w);
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open(path, &f, &err), 0);
    ck_assert_uint_eq(gguf_kv_count(f), 1);
    struct gguf_str s;
    ck_assert_int_eq(gguf_get_str(f, "k", &s, &err), 0);
    ck_assert(gguf_str_eq(s, "two"));
    gguf_close(f);
    free(path);
    dir_free(dir);
}
END_TEST

START_TEST(bad_tensors_and_metadata)
{
    struct gguf_writer *w;
    struct qerr err = {0};
    ck_assert_int_eq(gguf_writer_init(&w, &err), 0);
    uint64_t ne[] = {64, 2}, odd[] = {40, 2}, zero[] = {64, 0};
    ck_assert_int_eq(gguf_writer_add_tensor(w, "w", 2, ne, QTYPE_Q4_0, &err), 0);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "w", 2, ne, QTYPE_Q4_0, &err), QERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "twice"));
    ck_assert_int_eq(gguf_writer_add_tensor(w, "odd", 2, odd, QTYPE_Q4_0, &err), QERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "'odd'"));
    ck_assert_ptr_nonnull(strstr(err.msg, "40"));
    ck_assert_int_eq(gguf_writer_add_tensor(w, "odd", 2, odd, QTYPE_F32, &err), 0);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "z", 2, zero, QTYPE_F32, &err), QERR_INVALID);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "n0", 0, ne, QTYPE_F32, &err), QERR_INVALID);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "n5", 5, ne, QTYPE_F32, &err), QERR_INVALID);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "k", 2, ne, (enum qtype)12, &err), QERR_UNSUPPORTED);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "", 2, ne, QTYPE_F32, &err), QERR_INVALID);
    char longname[80];
    memset(longname, 'x', 64);
    longname[64] = '\0';
    ck_assert_int_eq(gguf_writer_add_tensor(w, longname, 2, ne, QTYPE_F32, &err), QERR_INVALID);
    longname[63] = '\0';
    ck_assert_int_eq(gguf_writer_add_tensor(w, longname, 2, ne, QTYPE_F32, &err), 0);
    ck_assert_uint_eq(gguf_writer_tensor_count(w), 3);
    ck_assert_int_eq(gguf_writer_set_arr(w, "a", GGUF_STRING, NULL, 0, &err), QERR_INVALID);
    ck_assert_int_eq(gguf_writer_set_arr(w, "a", GGUF_ARRAY, NULL, 0, &err), QERR_INVALID);

    /* an alignment that is not a power of two: refused before any file is created */
    char *dir = dir_new(), *path = path_in(dir, "out.gguf");
    ck_assert_int_eq(gguf_writer_set_u32(w, "general.alignment", 48, &err), 0);
    ck_assert_int_eq(gguf_writer_write(w, path, fill_pattern, NULL, NULL, &err), QERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "general.alignment"));
    char names[256];
    ck_assert_int_eq(dir_count(dir, names, sizeof names), 0);
    gguf_writer_free(w);
    free(path);
    dir_free(dir);
}
END_TEST

/* An injected write(2) that fails with ENOSPC once `limit` bytes have gone through, or, when
 * devfull >= 0, sends everything to /dev/full so the kernel itself says ENOSPC. */
struct fail_io {
    uint64_t limit, done;
    int devfull;
    int fsync_errno;
};

static ssize_t failing_write(void *ctx, int fd, const void *buf, size_t n)
{
    struct fail_io *f = ctx;
    if (f->devfull >= 0) return write(f->devfull, buf, n);
    if (f->done >= f->limit) {
        errno = ENOSPC;
        return -1;
    }
    if (n > f->limit - f->done) n = (size_t)(f->limit - f->done); /* a short write first */
    ssize_t k = write(fd, buf, n);
    if (k > 0) f->done += (uint64_t)k;
    return k;
}

static int failing_fsync(void *ctx, int fd)
{
    struct fail_io *f = ctx;
    if (f->fsync_errno) {
        errno = f->fsync_errno;
        return -1;
    }
    return fsync(fd);
}

/* The destination holds "old" before; after a failed write it still does, alone in dir. */
static void expect_failed_write(const char *dir, const char *path, struct gguf_writer *w,
                                gguf_tensor_fill_fn fill, const struct gguf_write_io *io,
                                int want_rc, const char *want_msg)
{
    FILE *fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fputs("old", fp);
    fclose(fp);
    struct qerr err = {0};
    int rc = gguf_writer_write(w, path, fill, NULL, io, &err);
    ck_assert_msg(rc == want_rc, "rc %d (%s), want %d", rc, err.msg, want_rc);
    ck_assert_msg(strstr(err.msg, want_msg) != NULL, "message '%s' lacks '%s'", err.msg, want_msg);
    ck_assert_msg(strstr(err.msg, path) != NULL, "message '%s' does not name the file", err.msg);
    char names[256];
    ck_assert_msg(dir_count(dir, names, sizeof names) == 1, "left behind: %s", names);
    size_t len;
    char *data = tu_read_file(path, &len);
    ck_assert_ptr_nonnull(data);
    ck_assert_str_eq(data, "old");
    free(data);
}

START_TEST(enospc_at_every_stage)
{
    char *dir = dir_new(), *path = path_in(dir, "out.gguf");
    struct gguf_writer *w = writer_full(64);
    struct qerr err = {0};
    ck_assert_int_eq(gguf_writer_write(w, path, fill_pattern, NULL, NULL, &err), 0);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    uint64_t total = (uint64_t)st.st_size;
    /* nothing written, inside the header, at the first tensor, inside the data, last byte */
    uint64_t limits[] = {0, 10, total - 400, total - 200, total - 70, total - 1};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        struct fail_io f = {.limit = limits[i], .devfull = -1};
        struct gguf_write_io io = {failing_write, failing_fsync, &f};
        expect_failed_write(dir, path, w, fill_pattern, &io, QERR_IO, "No space left on device");
    }
    /* the kernel's own ENOSPC */
    int fd = open("/dev/full", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        struct fail_io f = {.devfull = fd};
        struct gguf_write_io io = {failing_write, NULL, &f};
        expect_failed_write(dir, path, w, fill_pattern, &io, QERR_IO, "No space left on device");
        close(fd);
    }
    /* fsync fails (EIO) after every byte was written */
    struct fail_io f = {.limit = UINT64_MAX, .devfull = -1, .fsync_errno = EIO};
    struct gguf_write_io io = {failing_write, failing_fsync, &f};
    expect_failed_write(dir, path, w, fill_pattern, &io, QERR_IO, "fsync failed");
    gguf_writer_free(w);
    free(path);
    dir_free(dir);
}
END_TEST

static int fill_fails(void *ctx, uint64_t index, void *dst, size_t nbytes, struct qerr *err)
{
    if (index == 2)
        return qerr_set(err, QERR_FORMAT, "tensor %llu: boom", (unsigned long long)index);
    return fill_pattern(ctx, index, dst, nbytes, err);
}

START_TEST(callback_error_and_bad_directory)
{
    char *dir = dir_new(), *path = path_in(dir, "out.gguf");
    struct gguf_writer *w = writer_full(32);
    expect_failed_write(dir, path, w, fill_fails, NULL, QERR_FORMAT, "boom");
    struct qerr err = {0};
    char *missing = path_in(dir, "no/such/dir/out.gguf");
    ck_assert_int_eq(gguf_writer_write(w, missing, fill_pattern, NULL, NULL, &err), QERR_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "cannot create"));
    ck_assert_ptr_nonnull(strstr(err.msg, missing));
    gguf_writer_free(w);
    free(missing);
    free(path);
    dir_free(dir);
}
END_TEST

/* ---- requantization of a small synthetic model ---- */

struct src_model {
    float emb[4][64], q[8][64], norm[64], down[2][32], out[2][64], odd[2][40];
    uint16_t emb16[4][64], norm16[64], down_bf16[2][32];
    struct block_q8_0 out_q8[2][2];
};

static int fill_src(void *ctx, uint64_t index, void *dst, size_t nbytes, struct qerr *err)
{
    (void)err;
    const struct src_model *m = ctx;
    const void *src[] = {m->emb16, m->norm16, m->q, m->down_bf16, m->out_q8, m->odd};
    memcpy(dst, src[index], nbytes);
    return 0;
}

/* Writes the source model at path: token_embd F16, a 1-D F16 norm, attn_q F32, ffn_down BF16,
 * output Q8_0, and (with odd) a 2-D F32 tensor of 40-element rows. */
static void write_src(const char *path, struct src_model *m, bool odd)
{
    uint64_t seed = 7;
    for (int i = 0; i < 4 * 64; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        float v = (float)((int64_t)(seed >> 33) % 2001 - 1000) / 1000.0f;
        (&m->emb[0][0])[i] = v;
        (&m->emb16[0][0])[i] = f32_to_fp16(v);
        if (i < 8 * 64 / 4) (&m->norm[0])[i % 64] = 1.0f + v / 10;
        if (i < 2 * 32) {
            (&m->down[0][0])[i] = v * 3;
            uint32_t bits;
            float d = v * 3;
            memcpy(&bits, &d, 4);
            (&m->down_bf16[0][0])[i] = (uint16_t)(bits >> 16); /* truncation: exact enough */
        }
        if (i < 2 * 64) (&m->out[0][0])[i] = v / 2;
        if (i < 2 * 40) (&m->odd[0][0])[i] = v;
    }
    for (int i = 0; i < 8 * 64; i++) (&m->q[0][0])[i] = (float)sin(i * 0.37) * 0.1f;
    for (int i = 0; i < 64; i++) m->norm16[i] = f32_to_fp16(m->norm[i]);
    quantize_row_q8_0(&m->out[0][0], &m->out_q8[0][0], 128);
    struct gguf_writer *w;
    struct qerr err = {0};
    ck_assert_int_eq(gguf_writer_init(&w, &err), 0);
    ck_assert_int_eq(gguf_writer_set_str(w, "general.architecture", "llama", 5, &err), 0);
    ck_assert_int_eq(gguf_writer_set_u32(w, "general.file_type", 1, &err), 0);
    struct gguf_str toks[2] = {{"x", 1}, {"yz", 2}};
    ck_assert_int_eq(gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", toks, 2, &err), 0);
    uint64_t e[] = {64, 4}, n[] = {64}, q[] = {64, 8}, d[] = {32, 2}, o[] = {64, 2}, od[] = {40, 2};
    ck_assert_int_eq(gguf_writer_add_tensor(w, "token_embd.weight", 2, e, QTYPE_F16, &err), 0);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "blk.0.attn_norm.weight", 1, n, QTYPE_F16, &err), 0);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "blk.0.attn_q.weight", 2, q, QTYPE_F32, &err), 0);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "blk.0.ffn_down.weight", 2, d, QTYPE_BF16, &err), 0);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "output.weight", 2, o, QTYPE_Q8_0, &err), 0);
    if (odd)
        ck_assert_int_eq(gguf_writer_add_tensor(w, "blk.0.odd.weight", 2, od, QTYPE_F32, &err), 0);
    ck_assert_int_eq(gguf_writer_write(w, path, fill_src, m, NULL, &err), 0);
    gguf_writer_free(w);
}

/* Max |dequantized t - want| over n elements. */
static float max_err(const struct gguf_tensor *t, const float *want, size_t n)
{
    float *y = malloc(n * sizeof *y);
    qtype_dequantize_row(t->type, t->data, y, n);
    float e = 0;
    for (size_t i = 0; i < n; i++) e = fmaxf(e, fabsf(y[i] - want[i]));
    free(y);
    return e;
}

START_TEST(quantize_small_model)
{
    char *dir = dir_new(), *src = path_in(dir, "src.gguf"), *dst = path_in(dir, "q.gguf");
    static struct src_model m;
    write_src(src, &m, false);
    struct gguf_file *in, *out;
    struct qerr err = {0};
    ck_assert_int_eq(gguf_open(src, &in, &err), 0);

    struct gguf_quantize_opts o = {.type = QTYPE_Q4_0};
    struct gguf_quantize_stats st;
    ck_assert_msg(gguf_quantize(in, dst, &o, &st, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(st.n_tensors, 5);
    ck_assert_uint_eq(st.n_converted, 5);
    ck_assert_int_eq(gguf_open(dst, &out, &err), 0);
    uint32_t ft, qv;
    ck_assert_int_eq(gguf_get_u32(out, "general.file_type", &ft, &err), 0);
    ck_assert_uint_eq(ft, 2);
    ck_assert_int_eq(gguf_get_u32(out, "general.quantization_version", &qv, &err), 0);
    ck_assert_uint_eq(qv, 2);
    const struct gguf_kv *kv;
    ck_assert_int_eq(gguf_get_arr(out, "tokenizer.ggml.tokens", GGUF_STRING, &kv, &err), 0);
    ck_assert(gguf_str_eq(kv->strs[1], "yz"));
    const struct gguf_tensor *t = gguf_tensor_find(out, "token_embd.weight");
    ck_assert_int_eq(t->type, QTYPE_Q4_0);
    ck_assert_float_le(max_err(t, &m.emb[0][0], 256), 1.0f / 8 + 1e-3f);
    t = gguf_tensor_find(out, "blk.0.attn_norm.weight");
    ck_assert_int_eq(t->type, QTYPE_F32);
    for (int i = 0; i < 64; i++)
        ck_assert_float_eq(((const float *)t->data)[i], fp16_to_f32(m.norm16[i]));
    t = gguf_tensor_find(out, "blk.0.attn_q.weight");
    ck_assert_int_eq(t->type, QTYPE_Q4_0);
    struct block_q4_0 want[16];
    quantize_row_q4_0(&m.q[0][0], want, 512); /* exactly the reference quantizer's bytes */
    ck_assert_mem_eq(t->data, want, sizeof want);
    t = gguf_tensor_find(out, "blk.0.ffn_down.weight");
    ck_assert_int_eq(t->type, QTYPE_Q4_0);
    ck_assert_float_le(max_err(t, &m.down[0][0], 64), 3.0f / 8 + 0.05f);
    t = gguf_tensor_find(out, "output.weight");
    ck_assert_int_eq(t->type, QTYPE_Q4_0);
    gguf_close(out);

    /* Q8_0 keeping the output tensors: token_embd stays F16 and output.weight (already Q8_0)
     * is copied byte for byte */
    o = (struct gguf_quantize_opts){.type = QTYPE_Q8_0, .keep_output = true};
    ck_assert_int_eq(gguf_quantize(in, dst, &o, &st, &err), 0);
    ck_assert_uint_eq(st.n_copied, 2);
    ck_assert_int_eq(gguf_open(dst, &out, &err), 0);
    t = gguf_tensor_find(out, "token_embd.weight");
    ck_assert_int_eq(t->type, QTYPE_F16);
    ck_assert_mem_eq(t->data, m.emb16, sizeof m.emb16);
    t = gguf_tensor_find(out, "output.weight");
    ck_assert_int_eq(t->type, QTYPE_Q8_0);
    ck_assert_mem_eq(t->data, m.out_q8, sizeof m.out_q8);
    t = gguf_tensor_find(out, "blk.0.attn_q.weight");
    ck_assert_int_eq(t->type, QTYPE_Q8_0);
    ck_assert_float_le(max_err(t, &m.q[0][0], 512), 0.1f / 127 * 0.6f);
    ck_assert_int_eq(gguf_get_u32(out, "general.file_type", &ft, &err), 0);
    ck_assert_uint_eq(ft, 7);
    gguf_close(out);

    /* F32: everything dequantized */
    o = (struct gguf_quantize_opts){.type = QTYPE_F32};
    ck_assert_int_eq(gguf_quantize(in, dst, &o, &st, &err), 0);
    ck_assert_int_eq(gguf_open(dst, &out, &err), 0);
    t = gguf_tensor_find(out, "output.weight");
    ck_assert_int_eq(t->type, QTYPE_F32);
    float y[128];
    qtype_dequantize_row(QTYPE_Q8_0, m.out_q8, y, 128);
    ck_assert_mem_eq(t->data, y, sizeof y);
    gguf_close(out);

    char names[256];
    ck_assert_int_eq(dir_count(dir, names, sizeof names), 2);
    gguf_close(in);
    free(src);
    free(dst);
    dir_free(dir);
}
END_TEST

START_TEST(quantize_rejects_odd_rows_and_full_disk)
{
    char *dir = dir_new(), *src = path_in(dir, "src.gguf"), *dst = path_in(dir, "q.gguf");
    static struct src_model m;
    write_src(src, &m, true);
    struct gguf_file *in;
    struct qerr err = {0};
    ck_assert_int_eq(gguf_open(src, &in, &err), 0);
    struct gguf_quantize_opts o = {.type = QTYPE_Q4_1};
    ck_assert_int_eq(gguf_quantize(in, dst, &o, NULL, &err), QERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "'blk.0.odd.weight'"));
    ck_assert_ptr_nonnull(strstr(err.msg, "40"));
    char names[256];
    ck_assert_int_eq(dir_count(dir, names, sizeof names), 1); /* only src */
    /* F16 has no block: the odd rows are fine there */
    o.type = QTYPE_F16;
    ck_assert_int_eq(gguf_quantize(in, dst, &o, NULL, &err), 0);
    ck_assert_int_eq(unlink(dst), 0);
    /* a disk that fills up half way */
    struct fail_io f = {.limit = 3000, .devfull = -1};
    struct gguf_write_io io = {failing_write, NULL, &f};
    o = (struct gguf_quantize_opts){.type = QTYPE_F32, .io = &io};
    ck_assert_int_eq(gguf_quantize(in, dst, &o, NULL, &err), QERR_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "No space left on device"));
    ck_assert_int_eq(dir_count(dir, names, sizeof names), 1);
    o = (struct gguf_quantize_opts){.type = QTYPE_BF16};
    ck_assert_int_eq(gguf_quantize(in, dst, &o, NULL, &err), QERR_UNSUPPORTED);
    gguf_close(in);
    free(src);
    free(dst);
    dir_free(dir);
}
END_TEST

static int fill_floats(void *ctx, uint64_t index, void *dst, size_t nbytes, struct qerr *err)
{
    (void)index;
    (void)err;
    memcpy(dst, ctx, nbytes);
    return 0;
}

START_TEST(quantize_rejects_non_finite)
{
    char *dir = dir_new(), *src = path_in(dir, "src.gguf"), *dst = path_in(dir, "q.gguf");
    float x[2][32] = {{0}};
    x[1][7] = NAN;
    struct gguf_writer *w;
    struct qerr err = {0};
    ck_assert_int_eq(gguf_writer_init(&w, &err), 0);
    uint64_t ne[] = {32, 2};
    ck_assert_int_eq(gguf_writer_add_tensor(w, "blk.3.attn_k.weight", 2, ne, QTYPE_F32, &err), 0);
    ck_assert_int_eq(gguf_writer_write(w, src, fill_floats, x, NULL, &err), 0);
    gguf_writer_free(w);
    struct gguf_file *in;
    ck_assert_int_eq(gguf_open(src, &in, &err), 0);
    struct gguf_quantize_opts o = {.type = QTYPE_Q8_0};
    ck_assert_int_eq(gguf_quantize(in, dst, &o, NULL, &err), QERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "'blk.3.attn_k.weight' row 1 element 7"));
    ck_assert_ptr_nonnull(strstr(err.msg, dst));
    char names[256];
    ck_assert_int_eq(dir_count(dir, names, sizeof names), 1);
    gguf_close(in);
    free(src);
    free(dst);
    dir_free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gguf_write");
    TCase *tc = tcase_create("writer");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, all_types_roundtrip);
    tcase_add_test(tc, default_alignment_and_copy);
    tcase_add_test(tc, replace_and_remove);
    tcase_add_test(tc, bad_tensors_and_metadata);
    tcase_add_test(tc, enospc_at_every_stage);
    tcase_add_test(tc, callback_error_and_bad_directory);
    tcase_add_test(tc, quantize_small_model);
    tcase_add_test(tc, quantize_rejects_odd_rows_and_full_disk);
    tcase_add_test(tc, quantize_rejects_non_finite);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
