/* quern grammar: compiles a grammar as a request's response_format or structured_outputs would,
 * and says whether given texts are whole strings of it. For users who want to know what a
 * schema does before a request meets it, and for tools/schema-coverage.py, which runs a corpus
 * of schemas and their test instances through it (--jsonl). No model is loaded: texts are
 * matched byte by byte. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/grammar.h"
#include "cli.h"

static void grammar_usage(FILE *out)
{
    fprintf(
        out,
        "usage: quern grammar [--kind K] --source FILE [TEXT_FILE...]\n"
        "       quern grammar [--kind K] --jsonl FILE\n"
        "  --kind K        json_schema (default), regex, gbnf or choice (a JSON list)\n"
        "  --source FILE   the schema or grammar; each TEXT_FILE is matched against it\n"
        "  --jsonl FILE    one {\"source\": schema, \"texts\": [string, ...]} a line ('-':\n"
        "                  stdin); prints one line each: {\"ok\": true, \"states\": N, \"takes\":\n"
        "                  [bool, ...], \"ms\": compile time} or {\"ok\": false, \"code\": "
        "\"...\",\n"
        "                  \"error\": \"...\"}\n"
        "Exit: 0 when every source compiled and every text was taken, 1 otherwise.\n");
}

static int parse_kind(const char *s, enum grammar_kind *out)
{
    static const struct {
        const char *name;
        enum grammar_kind kind;
    } kinds[] = {{"json_schema", GRAMMAR_JSON_SCHEMA},
                 {"regex", GRAMMAR_REGEX},
                 {"gbnf", GRAMMAR_GBNF},
                 {"choice", GRAMMAR_CHOICE}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(s, kinds[i].name)) {
            *out = kinds[i].kind;
            return 0;
        }
    return -1;
}

/* A vocabulary of the 256 single bytes and an end token: texts are matched byte by byte. */
static int byte_vocab(struct grammar_vocab **out, struct qerr *err)
{
    char bytes[256];
    const char *ptrs[257];
    size_t lens[257];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        ptrs[i] = &bytes[i];
        lens[i] = 1;
    }
    ptrs[256] = NULL;
    lens[256] = 0;
    return grammar_vocab_create_raw(257, ptrs, lens, 256, out, err);
}

static int takes(struct grammar *g, const struct grammar_vocab *v, const char *s, size_t n)
{
    struct grammar_matcher *m;
    struct qerr err = {0};
    if (grammar_matcher_create(g, v, &m, &err)) return -1;
    int ok = !grammar_matcher_accept_bytes(m, s, n, &err) && grammar_matcher_accepting(m);
    grammar_matcher_free(m);
    return ok;
}

static const char *code_name(int rc)
{
    return rc == QERR_UNSUPPORTED ? "unsupported"
           : rc == QERR_INVALID   ? "invalid"
           : rc == QERR_FULL      ? "too_large"
                                  : "error";
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    if (f != stdin) fclose(f);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

/* One --jsonl line: compiles its source, matches its texts, prints the result line. Returns 0
 * when everything compiled and was taken. */
static int run_line(enum grammar_kind kind, const struct grammar_vocab *v, const char *line)
{
    cJSON *in = cJSON_Parse(line), *out = cJSON_CreateObject();
    int bad = 1;
    const cJSON *src = in ? cJSON_GetObjectItemCaseSensitive(in, "source") : NULL;
    if (!out) goto done;
    if (!src) {
        cJSON_AddBoolToObject(out, "ok", false);
        cJSON_AddStringToObject(out, "code", "bad_line");
        cJSON_AddStringToObject(out, "error", "not a JSON object with a \"source\"");
        goto done;
    }
    char *text = cJSON_IsString(src) ? strdup(src->valuestring) : cJSON_PrintUnformatted(src);
    struct grammar *g = NULL;
    struct qerr err = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = text ? grammar_compile(kind, text, strlen(text), &g, &err) : QERR_NOMEM;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    free(text);
    cJSON_AddBoolToObject(out, "ok", rc == 0);
    if (rc) {
        cJSON_AddStringToObject(out, "code", code_name(rc));
        cJSON_AddStringToObject(out, "error", err.msg);
        goto done;
    }
    cJSON_AddNumberToObject(out, "states", grammar_states(g));
    cJSON_AddNumberToObject(
        out, "ms", (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    cJSON *res = cJSON_AddArrayToObject(out, "takes");
    const cJSON *t;
    bad = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(in, "texts"))
    {
        int ok = cJSON_IsString(t) ? takes(g, v, t->valuestring, strlen(t->valuestring)) : -1;
        cJSON_AddItemToArray(res, cJSON_CreateBool(ok == 1));
        bad |= ok != 1;
    }
    grammar_unref(g);
done:;
    char *s = out ? cJSON_PrintUnformatted(out) : NULL;
    printf("%s\n", s ? s : "{\"ok\":false,\"code\":\"error\",\"error\":\"out of memory\"}");
    cJSON_free(s);
    cJSON_Delete(out);
    cJSON_Delete(in);
    return bad;
}

int cli_grammar(int argc, char **argv)
{
    static const struct option opts[] = {{"kind", required_argument, 0, 'k'},
                                         {"source", required_argument, 0, 's'},
                                         {"jsonl", required_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    enum grammar_kind kind = GRAMMAR_JSON_SCHEMA;
    const char *source = NULL, *jsonl = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'k' && parse_kind(optarg, &kind)) {
            fprintf(stderr, "quern grammar: unknown --kind '%s'\n", optarg);
            return EXIT_USAGE;
        } else if (c == 's') {
            source = optarg;
        } else if (c == 'j') {
            jsonl = optarg;
        } else if (c == 'h') {
            grammar_usage(stdout);
            return EXIT_OK;
        } else if (c != 'k') {
            grammar_usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (!source == !jsonl || (jsonl && optind < argc)) {
        grammar_usage(stderr);
        return EXIT_USAGE;
    }
    struct qerr err = {0};
    struct grammar_vocab *v = NULL;
    if (byte_vocab(&v, &err)) {
        fprintf(stderr, "quern grammar: %s\n", err.msg);
        return EXIT_RUNTIME;
    }
    int bad = 0;
    if (jsonl) {
        FILE *f = strcmp(jsonl, "-") ? fopen(jsonl, "r") : stdin;
        if (!f) {
            fprintf(stderr, "quern grammar: cannot open %s\n", jsonl);
            grammar_vocab_free(v);
            return EXIT_RUNTIME;
        }
        char *line = NULL;
        size_t cap = 0;
        while (getline(&line, &cap, f) > 0) bad |= run_line(kind, v, line);
        free(line);
        if (f != stdin) fclose(f);
        grammar_vocab_free(v);
        return bad ? EXIT_RUNTIME : EXIT_OK;
    }
    size_t len;
    char *text = read_all(source, &len);
    if (!text) {
        fprintf(stderr, "quern grammar: cannot read %s\n", source);
        grammar_vocab_free(v);
        return EXIT_RUNTIME;
    }
    struct grammar *g = NULL;
    int rc = grammar_compile(kind, text, len, &g, &err);
    free(text);
    if (rc) {
        printf("%s: %s: %s\n", source, code_name(rc), err.msg);
        grammar_vocab_free(v);
        return EXIT_RUNTIME;
    }
    printf("%s: compiled, %d states\n", source, grammar_states(g));
    for (int i = optind; i < argc; i++) {
        char *t = read_all(argv[i], &len);
        /* a file's last newline is not part of the text */
        if (t && len && t[len - 1] == '\n') t[--len] = 0;
        int ok = t ? takes(g, v, t, len) : -1;
        printf("%s: %s\n", argv[i], ok < 0 ? "cannot read" : ok ? "taken" : "not taken");
        bad |= ok != 1;
        free(t);
    }
    grammar_unref(g);
    grammar_vocab_free(v);
    return bad ? EXIT_RUNTIME : EXIT_OK;
}
