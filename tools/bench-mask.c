/* bench-mask: the structured-output token mask's cost per token.
 *
 * For every schema of tests/structured_schemas.json, compiles it, then walks it: at each step
 * computes the allowed-token mask (timed), applies it to a logits row (timed apart), and takes
 * a random allowed token (end-of-generation with probability 1/4 when allowed), up to --steps
 * tokens. Walks on a grammar whose masks were precomputed (as the server does at compile time,
 * on the HTTP thread, for grammars up to 4096 states) measure what a decode step pays; one walk
 * on a fresh grammar that fills its cache as it goes measures the lazy path (bigger grammars).
 * Vocabularies: the model's own, and with --vocab128k also a 128k one made of the model's tokens
 * plus 79k-odd concatenations of two of them (a stand-in for Llama 3's 128,256 tokens: same size,
 * similar byte lengths). One thread, as the engine computes masks.
 *
 *   build/tools/quern-bench-mask --model models/SmolLM2-135M-Instruct.Q4_1.gguf --vocab128k */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/gguf.h"
#include "../engine/grammar.h"
#include "../engine/tokenizer.h"

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

struct samples {
    double *v;
    size_t n, cap;
};

static void push(struct samples *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 4096;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (!s->v) exit(1);
    }
    s->v[s->n++] = x;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, struct samples *s)
{
    if (!s->n) return;
    qsort(s->v, s->n, sizeof *s->v, cmp_d);
    double sum = 0;
    for (size_t i = 0; i < s->n; i++) sum += s->v[i];
    printf("  %-22s n=%-7zu mean %8.1f us  p50 %8.1f  p99 %8.1f  max %9.1f\n", what, s->n,
           sum / (double)s->n, s->v[s->n / 2], s->v[(size_t)((double)(s->n - 1) * 0.99)],
           s->v[s->n - 1]);
}

static int bench_vocab(const char *label, struct grammar_vocab *v, cJSON *suite, int walks,
                       int steps, uint64_t seed)
{
    struct samples cold = {0}, warm = {0}, apply = {0}, compile = {0}, pre = {0};
    int words = grammar_mask_words(v), vocab = grammar_vocab_size(v);
    uint64_t *mask = malloc((size_t)words * sizeof *mask);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    if (!mask || !logits) return 1;
    uint64_t rng = seed;
    const cJSON *c;
    cJSON_ArrayForEach(c, suite)
    {
        char *text = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "schema"));
        struct qerr err = {0};
        /* walk 0: a fresh grammar filling its cache as it goes (what a grammar too big to
         * precompute costs); walks 1..: the grammar as the server uses it, precomputed */
        for (int w = 0; w <= walks; w++) {
            struct grammar *g;
            double t0 = now_us();
            if (grammar_compile(GRAMMAR_JSON_SCHEMA, text, strlen(text), &g, &err)) {
                fprintf(stderr, "%s: %s\n", cJSON_GetObjectItem(c, "name")->valuestring, err.msg);
                break;
            }
            if (w == 0) push(&compile, now_us() - t0);
            if (w > 0) {
                t0 = now_us();
                if (grammar_precompute(g, v, 1 << 30, &err)) return 1;
                if (w == 1) push(&pre, now_us() - t0);
            }
            struct grammar_matcher *m;
            if (grammar_matcher_create(g, v, &m, &err)) return 1;
            for (int k = 0; k < steps; k++) {
                t0 = now_us();
                int n = grammar_matcher_mask(m, mask);
                double t1 = now_us();
                push(w == 0 ? &cold : &warm, t1 - t0);
                for (int i = 0; i < vocab; i++) logits[i] = (float)(i & 255);
                t0 = now_us();
                grammar_mask_apply(mask, logits, vocab);
                push(&apply, now_us() - t0);
                if (n <= 0) break;
                /* end when allowed, 1 time in 4; else a random allowed token */
                int32_t pick = -1;
                bool eog_ok = false;
                for (int i = 0; i < words && !eog_ok; i++)
                    for (uint64_t x = mask[i]; x && !eog_ok; x &= x - 1)
                        eog_ok = grammar_vocab_is_eog(v, i * 64 + __builtin_ctzll(x));
                if (eog_ok && rng_next(&rng) % 4 == 0) break;
                int target = (int)(rng_next(&rng) % (uint64_t)n);
                for (int i = 0; i < words && pick < 0; i++) {
                    int pc = __builtin_popcountll(mask[i]);
                    if (target >= pc) {
                        target -= pc;
                        continue;
                    }
                    uint64_t x = mask[i];
                    while (target--) x &= x - 1;
                    pick = i * 64 + __builtin_ctzll(x);
                }
                if (grammar_vocab_is_eog(v, pick)) break;
                if (grammar_matcher_accept(m, pick, &err)) {
                    fprintf(stderr, "accept failed: %s\n", err.msg);
                    return 1;
                }
                if (grammar_matcher_done(m)) break;
            }
            grammar_matcher_free(m);
            grammar_unref(g);
        }
        free(text);
    }
    printf("%s (%d tokens, %d schemas)\n", label, vocab, cJSON_GetArraySize(suite));
    report("compile (schema->DFA)", &compile);
    report("precompute all masks", &pre);
    report("mask, precomputed", &warm);
    report("mask, filled lazily", &cold);
    report("apply to logits", &apply);
    free(pre.v);
    free(cold.v);
    free(warm.v);
    free(apply.v);
    free(compile.v);
    free(mask);
    free(logits);
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *schemas = "tests/structured_schemas.json";
    int walks = 4, steps = 200;
    bool big = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--schemas") && i + 1 < argc)
            schemas = argv[++i];
        else if (!strcmp(argv[i], "--walks") && i + 1 < argc)
            walks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vocab128k"))
            big = true;
        else {
            fprintf(stderr,
                    "usage: %s [--model GGUF] [--schemas JSON] [--walks N] [--steps N] "
                    "[--vocab128k]\n",
                    argv[0]);
            return 2;
        }
    }
    FILE *f = fopen(schemas, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", schemas);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) return 1;
    buf[len] = 0;
    fclose(f);
    cJSON *suite = cJSON_Parse(buf);
    free(buf);
    struct qerr err = {0};
    struct gguf_file *gf;
    struct tokenizer *tok;
    if (gguf_open(model, &gf, &err) || tokenizer_load(gf, &tok, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    struct grammar_vocab *v;
    double t0 = now_us();
    if (grammar_vocab_create(tok, tokenizer_vocab_size(tok), &v, &err)) return 1;
    printf("vocabulary trie built in %.1f ms\n", (now_us() - t0) / 1e3);
    int rc = bench_vocab("model vocabulary", v, suite, walks, steps, 42);
    grammar_vocab_free(v);
    if (big && !rc) {
        int nt = tokenizer_vocab_size(tok), nv = 128256;
        char **bytes = calloc((size_t)nv, sizeof *bytes);
        size_t *lens = calloc((size_t)nv, sizeof *lens);
        char tmp[1024];
        for (int i = 0; i < nt; i++) {
            if (tokenizer_is_control(tok, i)) continue;
            int n = tokenizer_token_bytes(tok, i, tmp, sizeof tmp);
            if (n <= 0 || n > (int)sizeof tmp) continue;
            bytes[i] = malloc((size_t)n);
            memcpy(bytes[i], tmp, (size_t)n);
            lens[i] = (size_t)n;
        }
        uint64_t rng = 7;
        for (int i = nt; i < nv; i++) {
            int a, b;
            do a = (int)(rng_next(&rng) % (uint64_t)nt), b = (int)(rng_next(&rng) % (uint64_t)nt);
            while (!lens[a] || !lens[b] || lens[a] + lens[b] > 24);
            bytes[i] = malloc(lens[a] + lens[b]);
            memcpy(bytes[i], bytes[a], lens[a]);
            memcpy(bytes[i] + lens[a], bytes[b], lens[b]);
            lens[i] = lens[a] + lens[b];
        }
        t0 = now_us();
        int32_t eog = tokenizer_eos(tok);
        rc = grammar_vocab_create_raw(nv, (const char *const *)bytes, lens, eog, &v, &err);
        if (!rc) {
            printf("128k vocabulary trie built in %.1f ms\n", (now_us() - t0) / 1e3);
            rc = bench_vocab("synthetic 128k vocabulary", v, suite, walks, steps, 42);
            grammar_vocab_free(v);
        }
        for (int i = 0; i < nv; i++) free(bytes[i]);
        free(bytes);
        free(lens);
    }
    cJSON_Delete(suite);
    tokenizer_free(tok);
    gguf_close(gf);
    return rc;
}
