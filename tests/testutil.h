/* testutil: what the Check suites share: where the real model and golden data are, and small
 * file helpers. */
#ifndef QUERN_TESTUTIL_H
#define QUERN_TESTUTIL_H

#include <stddef.h>

/* $QUERN_MODEL; exits 77 (meson's "skipped") when it is unset or the file is missing. */
const char *tu_model_path(void);
/* $QUERN_GOLDEN, or NULL when unset or missing. */
const char *tu_golden_path(void);
/* Reads a whole file into a malloc'd NUL-terminated buffer; NULL on failure. */
char *tu_read_file(const char *path, size_t *len);
/* Writes len bytes to a new temporary file and returns its malloc'd path. */
char *tu_write_temp(const void *data, size_t len);
/* True when the tests run under a sanitizer (slow): suites shrink their workloads. */
int tu_sanitized(void);

#endif
