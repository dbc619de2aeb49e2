/* chat: recognizes a chat template by its markers and formats conversations in C.
 *
 * DESIGN. Detection follows llama.cpp's llm_chat_detect_template (src/llama-chat.cpp) and the
 * formats follow its llm_chat_apply_template, with one addition: a ChatML template that writes a
 * literal system turn (SmolLM2's "You are a helpful AI assistant named SmolLM, ...") has that
 * text extracted, and chat_format inserts it when the conversation does not start with a system
 * message, as running the Jinja template would (Granite 3.x's default system text, which holds
 * the day's date, is left out as llama.cpp leaves it out). Templates that carry ChatML's marker but
 * are a different format (Phi-4's <|im_sep|>, SmolVLM's <end_of_utterance>) are refused rather than
 * formatted wrongly. Llama-3 text has no <|begin_of_text|>: BOS is the tokenizer's to add.
 * Every piece of message content is written through sb_content, which records its byte range:
 * chat_encode lets control tokens match only outside those ranges, so a client cannot write
 * "<|im_end|>" into a message and have it end the turn. */
#include "chat.h"

#include "chat_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* DeepSeek's markers: fullwidth bars (U+FF5C) and, in the end of sentence, U+2581 */
#define DS_USER      "<｜User｜>"
#define DS_ASSISTANT "<｜Assistant｜>"
#define DS_EOS       "<｜end▁of▁sentence｜>"

static bool has(const char *s, size_t len, const char *needle)
{
    return memmem(s, len, needle, strlen(needle)) != NULL;
}

const char *chat_kind_name(enum chat_kind k)
{
    switch (k) {
    case CHAT_CHATML:
        return "chatml";
    case CHAT_LLAMA3:
        return "llama3";
    case CHAT_LLAMA2:
        return "llama2";
    case CHAT_DEEPSEEK3:
        return "deepseek3";
    case CHAT_ZEPHYR:
        return "zephyr";
    case CHAT_PHI3:
        return "phi3";
    case CHAT_GEMMA:
        return "gemma";
    case CHAT_GRANITE:
        return "granite";
    }
    return "unknown";
}

const char *chat_tool_format_name(enum chat_tool_format f)
{
    switch (f) {
    case CHAT_TOOLS_HERMES:
        return "hermes";
    case CHAT_TOOLS_LLAMA3:
        return "llama3-json";
    case CHAT_TOOLS_MISTRAL:
        return "mistral";
    case CHAT_TOOLS_MISTRAL_ARGS:
        return "mistral-args";
    }
    return "unknown";
}

const char *chat_template_name(const struct chat_template *t)
{
    switch (t->kind) {
    case CHAT_CHATML:
        return t->think_model ? "qwen3" : "chatml";
    case CHAT_LLAMA3:
        return "llama3";
    case CHAT_DEEPSEEK3:
        return t->think ? "deepseek-r1" : "deepseek3";
    case CHAT_ZEPHYR:
        return "zephyr";
    case CHAT_PHI3:
        return "phi3";
    case CHAT_GEMMA:
        return t->first_user_prefix ? "gemma3" : "gemma";
    case CHAT_GRANITE:
        return "granite";
    case CHAT_LLAMA2:
        break;
    }
    switch (t->variant) {
    case CHAT_VARIANT_LLAMA2:
        return "llama2";
    case CHAT_VARIANT_LLAMA2_SYS:
        return "llama2-sys";
    case CHAT_VARIANT_LLAMA2_SYS_BOS:
        return "llama2-sys-bos";
    case CHAT_VARIANT_LLAMA2_SYS_STRIP:
        return "llama2-sys-strip";
    case CHAT_VARIANT_MISTRAL_V1:
        return "mistral-v1";
    case CHAT_VARIANT_MISTRAL_V3:
        return "mistral-v3";
    case CHAT_VARIANT_MISTRAL_V3_TEKKEN:
        return "mistral-v3-tekken";
    case CHAT_VARIANT_MISTRAL_V7:
        return "mistral-v7";
    default:
        return "llama2";
    }
}

/* The text of a literal "<|im_start|>system\n...<|im_end|>" inside one Jinja string literal,
 * unescaped and malloc'd; NULL when there is none (or on OOM, which only loses the default). */
static char *chatml_default_system(const char *s, size_t len)
{
    static const char head[] = "<|im_start|>system";
    const char *end = s + len;
    for (const char *p = s; (p = memmem(p, (size_t)(end - p), head, sizeof head - 1));
         p += sizeof head - 1) {
        /* the quote that opens the literal holding the marker */
        const char *q = p;
        while (q > s && q[-1] != '\'' && q[-1] != '"' && q[-1] != '}' && q[-1] != '{') q--;
        if (q == s || (q[-1] != '\'' && q[-1] != '"')) continue;
        char quote = q[-1];
        const char *c = p + sizeof head - 1;
        if (c < end && *c == '\n')
            c++;
        else if (end - c >= 2 && c[0] == '\\' && c[1] == 'n')
            c += 2;
        else
            continue;
        const char *stop = memmem(c, (size_t)(end - c), "<|im_end|>", 10);
        if (!stop || stop == c) continue;
        char *out = malloc((size_t)(stop - c) + 1), *o = out;
        if (!out) return NULL;
        bool ok = true;
        for (const char *x = c; x < stop && ok; x++) {
            if (*x == quote) {
                ok = false; /* the literal ends before <|im_end|>: not a fixed prompt */
            } else if (*x == '\\' && x + 1 < stop) {
                x++;
                *o++ = *x == 'n' ? '\n' : *x == 't' ? '\t' : *x;
            } else {
                *o++ = *x;
            }
        }
        *o = '\0';
        if (ok) return out;
        free(out);
    }
    return NULL;
}

/* Gemma's (Gemma 1, 2, 3, 3n, MedGemma): one expression opens every turn with
 * '<start_of_turn>' + role and a line break (the assistant's role renamed "model"), contents
 * trimmed, <end_of_turn> and a line break closing a turn, <start_of_turn>model and a line break
 * the generation prompt. Templates that give the system or developer a turn of its own
 * (FunctionGemma's, some fine-tunes') format otherwise: refused. Gemma 3's names the system text
 * first_user_prefix. */
static int gemma_parse(const char *s, size_t len, struct chat_template *out, struct qerr *err)
{
    bool turns = false;
    for (int esc = 0; esc < 2 && !turns; esc++) {
        const char *nl = esc ? "\\n" : "\n";
        char open[48], close[32], gen_prompt[40];
        snprintf(open, sizeof open, "'<start_of_turn>' + role + '%s'", nl);
        snprintf(close, sizeof close, "<end_of_turn>%s'", nl);
        snprintf(gen_prompt, sizeof gen_prompt, "'<start_of_turn>model%s'", nl);
        turns = has(s, len, open) && has(s, len, close) && has(s, len, gen_prompt);
    }
    bool model = has(s, len, "\"model\"") || has(s, len, "'model'");
    if (!turns || !model || !has(s, len, "| trim") || has(s, len, "<start_of_turn>system") ||
        has(s, len, "<start_of_turn>developer"))
        return qerr_set(err, QERR_UNSUPPORTED,
                        "chat template: uses <start_of_turn> but not Gemma's turns (a system or "
                        "developer turn of its own, or other spellings): \"%.*s\"",
                        (int)(len > 80 ? 80 : len), s);
    out->kind = CHAT_GEMMA;
    out->first_user_prefix = has(s, len, "first_user_prefix");
    return 0;
}

static enum chat_variant inst_variant(const char *s, size_t len)
{
    if (has(s, len, "[SYSTEM_PROMPT]")) return CHAT_VARIANT_MISTRAL_V7;
    if (has(s, len, "' [INST] ' + system_message") || has(s, len, "[AVAILABLE_TOOLS]")) {
        if (has(s, len, " [INST]")) return CHAT_VARIANT_MISTRAL_V1;
        if (has(s, len, "\"[INST]\"")) return CHAT_VARIANT_MISTRAL_V3_TEKKEN;
        return CHAT_VARIANT_MISTRAL_V3;
    }
    if (has(s, len, "content.strip()")) return CHAT_VARIANT_LLAMA2_SYS_STRIP;
    if (has(s, len, "bos_token + '[INST]")) return CHAT_VARIANT_LLAMA2_SYS_BOS;
    if (has(s, len, "<<SYS>>")) return CHAT_VARIANT_LLAMA2_SYS;
    return CHAT_VARIANT_LLAMA2;
}

int chat_template_parse(const char *tmpl, size_t len, struct chat_template *out, struct qerr *err)
{
    memset(out, 0, sizeof *out);
    if (!tmpl || len == 0)
        return qerr_set(err, QERR_UNSUPPORTED, "chat template: empty (the model has none)");
    if (has(tmpl, len, "<|im_start|>")) {
        if (has(tmpl, len, "<|im_sep|>") || has(tmpl, len, "<end_of_utterance>"))
            return qerr_set(err, QERR_UNSUPPORTED,
                            "chat template: uses <|im_start|> but is not ChatML (Phi-4 or "
                            "SmolVLM markers): \"%.80s\"",
                            tmpl);
        /* SmolLM3's writes a metadata system block (its reasoning mode, /think and /no_think
         * switches) that plain ChatML would leave out */
        if (has(tmpl, len, "Reasoning Mode"))
            return qerr_set(err, QERR_UNSUPPORTED,
                            "chat template: SmolLM3's (a \"## Metadata\" system block with its "
                            "reasoning mode) is not one quern writes; name another with "
                            "--chat-template");
        out->kind = CHAT_CHATML;
        out->default_system = chatml_default_system(tmpl, len);
        /* Qwen3's: reasoning_content handed back, and a switch for thinking */
        out->think_model = has(tmpl, len, "reasoning_content") && has(tmpl, len, "enable_thinking");
        return 0;
    }
    if (has(tmpl, len, "[INST]")) {
        out->kind = CHAT_LLAMA2;
        out->variant = inst_variant(tmpl, len);
        if (has(tmpl, len, "[TOOL_CALLS]"))
            out->tools = has(tmpl, len, "[ARGS]") ? CHAT_TOOLS_MISTRAL_ARGS : CHAT_TOOLS_MISTRAL;
        return 0;
    }
    if (has(tmpl, len, "<|start_header_id|>") && has(tmpl, len, "<|end_header_id|>")) {
        out->kind = CHAT_LLAMA3;
        out->tools = CHAT_TOOLS_LLAMA3;
        return 0;
    }
    if (has(tmpl, len, DS_USER) && has(tmpl, len, DS_ASSISTANT) && has(tmpl, len, DS_EOS)) {
        out->kind = CHAT_DEEPSEEK3;
        out->think = has(tmpl, len, DS_ASSISTANT "<think>");
        return 0;
    }
    /* Zephyr's user turn ends with the model's eos_token, as Falcon 3's (a "\n") and Phi-3's
     * (<|end|>), with the same role markers, do not: its own expressions are the marker, with
     * the line break after each that writes the "\n" after a turn and after the generation
     * prompt (copies written on one line, or with '\n' added, format otherwise: refused) */
    if (has(tmpl, len, "'<|user|>\\n' + message['content'] + eos_token }}\n") &&
        has(tmpl, len, "{{ '<|assistant|>' }}\n")) {
        out->kind = CHAT_ZEPHYR;
        return 0;
    }
    /* Phi-3.5's: each role's expression writes its tag, a line break, the content, <|end|> and a
     * line break (the break written as "\n" or as a line break inside the string); Phi-3's first
     * template (an assistant tag after every user turn, no system turn) and Phi-4-mini's (no
     * break after the tags) format otherwise: refused */
    for (int esc = 0; esc < 2; esc++) {
        const char *nl = esc ? "\\n" : "\n";
        char user[96], assistant[96], gen_prompt[48];
        snprintf(user, sizeof user, "'<|user|>%s' + message['content'] + '<|end|>%s'", nl, nl);
        snprintf(assistant, sizeof assistant,
                 "'<|assistant|>%s' + message['content'] + '<|end|>%s'", nl, nl);
        snprintf(gen_prompt, sizeof gen_prompt, "'<|assistant|>%s' }}", nl);
        if (has(tmpl, len, user) && has(tmpl, len, assistant) && has(tmpl, len, gen_prompt)) {
            out->kind = CHAT_PHI3;
            out->skip_empty_system =
                has(tmpl, len, "message['role'] == 'system' and message['content']");
            return 0;
        }
    }
    if (has(tmpl, len, "<start_of_turn>")) return gemma_parse(tmpl, len, out, err);
    /* IBM Granite's role markers, told apart as llama.cpp does: Granite 4.0's and 4.1's (tools
     * inside <tools>, calls in <tool_call>, a default system text of their own) format
     * otherwise: refused; the rest is Granite 3.x's (3.0 to 3.3) */
    if (has(tmpl, len, "<|start_of_role|>")) {
        if (has(tmpl, len, "<tool_call>") || has(tmpl, len, "<tools>"))
            return qerr_set(err, QERR_UNSUPPORTED,
                            "chat template: Granite 4's (<|start_of_role|> with <tools> and "
                            "<tool_call>) is not one quern writes; name another with "
                            "--chat-template");
        out->kind = CHAT_GRANITE;
        return 0;
    }
    return qerr_set(err, QERR_UNSUPPORTED,
                    "chat template: not recognized (no <|im_start|>, [INST], "
                    "<|start_header_id|>, <｜User｜>, <|user|>, <start_of_turn> or "
                    "<|start_of_role|> marker): \"%.*s%s\"",
                    (int)(len > 80 ? 80 : len), tmpl, len > 80 ? "..." : "");
}

int chat_template_by_name(const char *name, struct chat_template *out, struct qerr *err)
{
    static const struct chat_template named[] = {
        {.kind = CHAT_CHATML},
        {.kind = CHAT_LLAMA3, .tools = CHAT_TOOLS_LLAMA3},
        {.kind = CHAT_LLAMA2, .variant = CHAT_VARIANT_LLAMA2},
        {.kind = CHAT_LLAMA2, .variant = CHAT_VARIANT_LLAMA2_SYS},
        {.kind = CHAT_LLAMA2, .variant = CHAT_VARIANT_LLAMA2_SYS_BOS},
        {.kind = CHAT_LLAMA2, .variant = CHAT_VARIANT_LLAMA2_SYS_STRIP},
        {.kind = CHAT_LLAMA2, .variant = CHAT_VARIANT_MISTRAL_V1, .tools = CHAT_TOOLS_MISTRAL},
        {.kind = CHAT_LLAMA2, .variant = CHAT_VARIANT_MISTRAL_V3, .tools = CHAT_TOOLS_MISTRAL},
        {.kind = CHAT_LLAMA2,
         .variant = CHAT_VARIANT_MISTRAL_V3_TEKKEN,
         .tools = CHAT_TOOLS_MISTRAL},
        {.kind = CHAT_LLAMA2, .variant = CHAT_VARIANT_MISTRAL_V7, .tools = CHAT_TOOLS_MISTRAL},
        {.kind = CHAT_DEEPSEEK3},
        {.kind = CHAT_DEEPSEEK3, .think = true},
        {.kind = CHAT_ZEPHYR},
        {.kind = CHAT_PHI3, .skip_empty_system = true},
        {.kind = CHAT_GEMMA},
        {.kind = CHAT_GEMMA, .first_user_prefix = true},
        {.kind = CHAT_CHATML, .think_model = true},
        {.kind = CHAT_GRANITE},
    };
    char names[256] = "";
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        const char *n = chat_template_name(&named[i]);
        if (name && !strcmp(name, n)) {
            *out = named[i];
            return 0;
        }
        size_t at = strlen(names);
        snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "", n);
    }
    memset(out, 0, sizeof *out);
    return qerr_set(err, QERR_UNSUPPORTED, "chat template '%.40s': not a known name (%s)",
                    name ? name : "", names);
}

void chat_template_free(struct chat_template *t)
{
    if (!t) return;
    free(t->default_system);
    t->default_system = NULL;
}

/* ---- formatting ---- */

void sb_put(struct sb *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void sb_str(struct sb *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

/* Appends message content n bytes long, noting its range. */
void sb_content(struct sb *b, const char *s, size_t n)
{
    size_t at = b->n;
    sb_put(b, s, n);
    b->content_end = b->n;
    if (b->oom || !b->spans || n == 0) return;
    if (b->n_span == b->cap_span) {
        size_t cap = b->cap_span ? 2 * b->cap_span : 8;
        struct tokenizer_span *q = realloc(b->span, cap * sizeof *q);
        if (!q) {
            b->oom = true;
            return;
        }
        b->span = q;
        b->cap_span = cap;
    }
    b->span[b->n_span++] = (struct tokenizer_span){at, n};
}

void sb_msg(struct sb *b, const char *s)
{
    sb_content(b, s, strlen(s));
}

bool chat_is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Appends content s with leading and trailing ASCII whitespace removed (llama.cpp's trim). */
void sb_trimmed(struct sb *b, const char *s)
{
    size_t n = strlen(s), i = 0;
    while (i < n && chat_is_space(s[i])) i++;
    while (n > i && chat_is_space(s[n - 1])) n--;
    sb_content(b, s + i, n - i);
}

/* Each message as open role mid content close (content trimmed when trim): the turns of
 * ChatML, Llama 3, Zephyr and Granite. */
static void role_turns(const struct chat_msg *m, size_t n, const char *open, const char *mid,
                       const char *close, bool trim, struct sb *b)
{
    for (size_t i = 0; i < n; i++) {
        sb_str(b, open);
        sb_str(b, m[i].role);
        sb_str(b, mid);
        if (trim)
            sb_trimmed(b, m[i].content);
        else
            sb_msg(b, m[i].content);
        sb_str(b, close);
    }
}

void chat_split_think(const struct chat_msg *m, struct chat_think *out)
{
    const char *c = m->content ? m->content : "";
    *out = (struct chat_think){.text = c, .text_len = strlen(c), .reasoning = ""};
    if (m->reasoning) {
        out->reasoning = m->reasoning;
        out->reasoning_len = strlen(m->reasoning);
        return;
    }
    const char *first = strstr(c, "</think>"), *last = first, *x;
    if (!first) return;
    while ((x = strstr(last + 8, "</think>"))) last = x;
    /* content.split('</think>')[-1].lstrip('\n') */
    const char *t = last + 8;
    while (*t == '\n') t++;
    out->text = t;
    out->text_len = strlen(t);
    /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
    size_t n0 = (size_t)(first - c);
    while (n0 && c[n0 - 1] == '\n') n0--;
    const char *r = c;
    for (x = c; (x = memmem(x, n0 - (size_t)(x - c), "<think>", 7)); x += 7) r = x + 7;
    while (r < c + n0 && *r == '\n') r++;
    out->reasoning = r;
    out->reasoning_len = (size_t)(c + n0 - r);
}

/* Qwen3's last question: the last user message that is not a tool result wrapped as one; n - 1
 * when there is none (so no answer follows it) */
static size_t last_question(const struct chat_msg *m, const enum role *r, size_t n)
{
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    for (size_t i = n; i-- > 0;) {
        if (r[i] != ROLE_USER) continue;
        const char *c = m[i].content;
        size_t len = strlen(c);
        bool wrapped = len >= sizeof close - 1 && !strncmp(c, open, sizeof open - 1) &&
                       !strcmp(c + len - (sizeof close - 1), close);
        if (!wrapped) return i;
    }
    return n ? n - 1 : 0;
}

/* An answer as Qwen3's template writes it: its reasoning only after the last question, and
 * there for the last message (an empty block) or where it has some */
static void qwen3_answer(const struct chat_msg *m, bool keep_reasoning, bool last, struct sb *b)
{
    struct chat_think th;
    chat_split_think(m, &th);
    sb_str(b, "<|im_start|>assistant\n");
    if (keep_reasoning && (last || th.reasoning_len)) {
        const char *r = th.reasoning, *e = th.reasoning + th.reasoning_len;
        while (r < e && *r == '\n') r++;
        while (e > r && e[-1] == '\n') e--;
        sb_str(b, "<think>\n");
        sb_content(b, r, (size_t)(e - r));
        sb_str(b, "\n</think>\n\n");
        const char *t = th.text, *te = th.text + th.text_len;
        while (t < te && *t == '\n') t++;
        sb_content(b, t, (size_t)(te - t));
    } else {
        sb_content(b, th.text, th.text_len);
    }
    sb_str(b, "<|im_end|>\n");
}

static void fmt_chatml(const struct chat_template *t, const struct chat_msg *m, const enum role *r,
                       size_t n, bool gen, struct sb *b)
{
    if (n > 0 && r[0] != ROLE_SYSTEM && t->default_system) {
        sb_str(b, "<|im_start|>system\n");
        sb_str(b, t->default_system);
        sb_str(b, "<|im_end|>\n");
    }
    if (!t->think_model) {
        role_turns(m, n, "<|im_start|>", "\n", "<|im_end|>\n", false, b);
    } else {
        size_t q = last_question(m, r, n);
        for (size_t i = 0; i < n; i++) {
            if (r[i] == ROLE_ASSISTANT)
                qwen3_answer(&m[i], i > q, i + 1 == n, b);
            else
                role_turns(&m[i], 1, "<|im_start|>", "\n", "<|im_end|>\n", false, b);
        }
    }
    if (gen) sb_str(b, "<|im_start|>assistant\n");
}

static void fmt_llama3(const struct chat_msg *m, size_t n, bool gen, struct sb *b)
{
    role_turns(m, n, "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", true, b);
    if (gen) sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void fmt_mistral_v7(const struct chat_msg *m, const enum role *r, size_t n, struct sb *b)
{
    for (size_t i = 0; i < n; i++) {
        if (r[i] == ROLE_SYSTEM) {
            sb_str(b, "[SYSTEM_PROMPT] ");
            sb_msg(b, m[i].content);
            sb_str(b, "[/SYSTEM_PROMPT]");
        } else if (r[i] == ROLE_USER) {
            sb_str(b, "[INST] ");
            sb_msg(b, m[i].content);
            sb_str(b, "[/INST]");
        } else {
            sb_str(b, " ");
            sb_msg(b, m[i].content);
            sb_str(b, "</s>");
        }
    }
}

static void fmt_mistral(enum chat_variant v, const struct chat_msg *m, const enum role *r, size_t n,
                        struct sb *b)
{
    const char *lead = v == CHAT_VARIANT_MISTRAL_V1 ? " " : "";
    const char *trail = v == CHAT_VARIANT_MISTRAL_V3_TEKKEN ? "" : " ";
    bool inside = false;
    for (size_t i = 0; i < n; i++) {
        if (!inside) {
            sb_str(b, lead);
            sb_str(b, "[INST]");
            sb_str(b, trail);
            inside = true;
        }
        if (r[i] == ROLE_SYSTEM) {
            sb_msg(b, m[i].content);
            sb_str(b, "\n\n");
        } else if (r[i] == ROLE_USER) {
            sb_msg(b, m[i].content);
            sb_str(b, lead);
            sb_str(b, "[/INST]");
        } else {
            sb_str(b, trail);
            if (v == CHAT_VARIANT_MISTRAL_V3)
                sb_trimmed(b, m[i].content);
            else
                sb_msg(b, m[i].content);
            sb_str(b, "</s>");
            inside = false;
        }
    }
}

static void fmt_llama2(enum chat_variant v, const struct chat_msg *m, const enum role *r, size_t n,
                       struct sb *b)
{
    bool sys = v != CHAT_VARIANT_LLAMA2, bos = v == CHAT_VARIANT_LLAMA2_SYS_BOS;
    bool strip = v == CHAT_VARIANT_LLAMA2_SYS_STRIP, inside = true;
    sb_str(b, "[INST] ");
    for (size_t i = 0; i < n; i++) {
        if (!inside) {
            inside = true;
            sb_str(b, bos ? "<s>[INST] " : "[INST] ");
        }
        if (r[i] == ROLE_SYSTEM) sb_str(b, sys ? "<<SYS>>\n" : "");
        if (strip)
            sb_trimmed(b, m[i].content);
        else
            sb_msg(b, m[i].content);
        if (r[i] == ROLE_SYSTEM) {
            sb_str(b, sys ? "\n<</SYS>>\n\n" : "\n");
        } else if (r[i] == ROLE_USER) {
            sb_str(b, " [/INST]");
        } else {
            sb_str(b, "</s>");
            inside = false;
        }
    }
}

/* DeepSeek-R1-Distill-Llama's template, tool turns included: the last system message's text
 * first, then the turns; an assistant's text after its last "</think>" (earlier reasoning is
 * not kept); calls in ```json blocks; results between output markers. Two of its quirks are
 * kept as its Jinja has them: only the first assistant message with calls opens the calls
 * block (later ones write continuation calls), and a lone call never closes it. The tool
 * list itself is nowhere in the template: offering tools is refused. */
static int fmt_deepseek3(const struct chat_template *t, const struct chat_msg *m,
                         const enum role *r, size_t n, const cJSON *tools, bool gen, struct sb *b,
                         struct qerr *err)
{
    if (tools && cJSON_GetArraySize(tools) > 0)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "chat template %s: it writes no tool list, so tools cannot be offered",
                        chat_template_name(t));
    const char *sys = NULL;
    for (size_t i = 0; i < n; i++)
        if (r[i] == ROLE_SYSTEM) sys = m[i].content;
    if (sys) sb_msg(b, sys);
    bool first_call = true, first_output = true, in_tool = false;
    for (size_t i = 0; i < n; i++) {
        if (r[i] == ROLE_USER) {
            sb_str(b, DS_USER);
            sb_msg(b, m[i].content);
            in_tool = false;
        } else if (r[i] == ROLE_ASSISTANT && !m[i].content) {
            for (size_t k = 0; k < m[i].n_calls; k++) {
                const struct chat_call *c = &m[i].calls[k];
                if (!c->name || !*c->name)
                    return qerr_set(err, QERR_INVALID,
                                    "chat_format: message %zu: tool call %zu has no name", i, k);
                sb_str(b, first_call ? DS_ASSISTANT "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
                                     : "\n<｜tool▁call▁begin｜>");
                sb_str(b, "function<｜tool▁sep｜>");
                sb_msg(b, c->name);
                sb_str(b, "\n```json\n");
                sb_msg(b, c->arguments ? c->arguments : "");
                sb_str(b, "\n```<｜tool▁call▁end｜>");
                if (!first_call) sb_str(b, "<｜tool▁calls▁end｜>" DS_EOS);
                first_call = false;
            }
            in_tool = false;
        } else if (r[i] == ROLE_ASSISTANT) {
            if (in_tool) {
                sb_str(b, "<｜tool▁outputs▁end｜>");
                sb_msg(b, m[i].content);
            } else {
                const char *c = m[i].content, *x;
                while ((x = strstr(c, "</think>"))) c = x + strlen("</think>");
                sb_str(b, DS_ASSISTANT);
                sb_msg(b, c);
            }
            sb_str(b, DS_EOS);
            in_tool = false;
        } else if (r[i] == ROLE_TOOL) {
            sb_str(b, first_output ? "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>"
                                   : "\n<｜tool▁output▁begin｜>");
            sb_msg(b, m[i].content ? m[i].content : "");
            sb_str(b, "<｜tool▁output▁end｜>");
            first_output = false;
            in_tool = true;
        }
    }
    if (in_tool) sb_str(b, "<｜tool▁outputs▁end｜>");
    if (gen && !in_tool) sb_str(b, t->think ? DS_ASSISTANT "<think>\n" : DS_ASSISTANT);
    return 0;
}

/* Zephyr's template (TinyLlama-1.1B-Chat's too): each turn "<|role|>\n" content "</s>\n",
 * the eos_token of the Llama and Mistral tokenizers these models use; then "<|assistant|>\n"
 * (the template's own newline after its last tag, which transformers' rendering keeps). */
static void fmt_zephyr(const struct chat_msg *m, size_t n, bool gen, struct sb *b)
{
    role_turns(m, n, "<|", "|>\n", "</s>\n", false, b);
    if (gen && n > 0) sb_str(b, "<|assistant|>\n");
}

/* Phi-3.5's template: each turn "<|role|>\n" content "<|end|>\n" (an empty system message left
 * out where the template says so), then "<|assistant|>\n", or for a closed conversation the
 * eos_token of Phi-3's tokenizer. */
static void fmt_phi3(const struct chat_template *t, const struct chat_msg *m, const enum role *r,
                     size_t n, bool gen, struct sb *b)
{
    for (size_t i = 0; i < n; i++)
        if (!(t->skip_empty_system && r[i] == ROLE_SYSTEM && (!m[i].content || !*m[i].content)))
            role_turns(&m[i], 1, "<|", "|>\n", "<|end|>\n", false, b);
    sb_str(b, gen ? "<|assistant|>\n" : "<|endoftext|>");
}

/* Gemma 3's template writes a system message after the first one as a turn of its own where it
 * expects a model turn: at an odd place among the messages after the first system message (at
 * an even one it refuses the conversation). */
static bool gemma_system_turn(const struct chat_template *t, const enum role *r, size_t k)
{
    return t->first_user_prefix && r[k] == ROLE_SYSTEM && k > 0 &&
           (k - (r[0] == ROLE_SYSTEM)) % 2 == 1;
}

/* The system texts among m[from, to) where a Gemma user turn opens: Gemma 3's first message as it
 * is (its first text part when it came in parts) and "\n\n"; the others as llama.cpp writes
 * every one, trimmed and joined, then "\n\n" unless they are all empty. */
static void gemma_system(const struct chat_template *t, const struct chat_msg *m,
                         const enum role *r, size_t from, size_t to, struct sb *b)
{
    bool any = false;
    for (size_t k = from; k < to; k++) {
        if (r[k] != ROLE_SYSTEM || gemma_system_turn(t, r, k)) continue;
        if (k == 0 && t->first_user_prefix) {
            sb_msg(b, m[0].n_parts ? m[0].parts[0] : m[0].content);
            sb_str(b, "\n\n");
            continue;
        }
        const char *c = m[k].content;
        while (chat_is_space(*c)) c++;
        any |= *c != '\0';
        sb_trimmed(b, m[k].content);
    }
    if (any) sb_str(b, "\n\n");
}

/* Gemma's turns: "<start_of_turn>user\n" or "<start_of_turn>model\n", the content trimmed (Gemma
 * 3's text parts each), "<end_of_turn>\n"; then "<start_of_turn>model\n". A system message has no
 * turn: its text opens the next user turn (gemma_system). Both templates refuse roles that do
 * not alternate user/model (and Gemma 2's any system message); quern writes such conversations
 * as llama.cpp does, as it does for Mistral's, whose templates refuse them too. */
static void fmt_gemma(const struct chat_template *t, const struct chat_msg *m, const enum role *r,
                      size_t n, bool gen, struct sb *b)
{
    size_t since = 0; /* the system messages from here on wait for the next user turn */
    for (size_t i = 0; i < n; i++) {
        bool own = gemma_system_turn(t, r, i);
        if (r[i] == ROLE_SYSTEM && !own) continue;
        sb_str(b, "<start_of_turn>");
        sb_str(b, r[i] == ROLE_ASSISTANT ? "model" : m[i].role);
        sb_str(b, "\n");
        if (r[i] == ROLE_USER) {
            gemma_system(t, m, r, since, i, b);
            since = i + 1;
        }
        if (t->first_user_prefix && m[i].n_parts)
            for (size_t k = 0; k < m[i].n_parts; k++) sb_trimmed(b, m[i].parts[k]);
        else
            sb_trimmed(b, m[i].content);
        sb_str(b, "<end_of_turn>\n");
    }
    if (gen) sb_str(b, "<start_of_turn>model\n");
}

/* IBM Granite 3.x's turns, as llama.cpp's LLM_CHAT_TEMPLATE_GRANITE_3_X writes them: each
 * message "<|start_of_role|>" role "<|end_of_role|>" content (as it is) "<|end_of_text|>\n",
 * then "<|start_of_role|>assistant<|end_of_role|>". Two places where the Jinja differs, written
 * as llama.cpp writes them: a conversation without a system message gets no system turn (the
 * template's default, "Knowledge Cutoff Date: April 2024. Today's Date: " + strftime_now(...)
 * + ". You are Granite, developed by IBM. You are a helpful AI assistant." and more with tools
 * or documents, holds the day's date: it would change the prompt every day and defeat the prefix
 * cache), and the generation prompt follows any messages (the template writes it only after a
 * message besides the first system one). Tools go through the Hermes rewrite, as for Gemma:
 * Granite's own form (the list as JSON in an available_tools turn, calls answered as
 * <|tool_call|>[{"name": .., "arguments": ..}]) has no reader of the model's calls in the server,
 * and the template writes no calls of an assistant message. */
static void fmt_granite(const struct chat_msg *m, size_t n, bool gen, struct sb *b)
{
    role_turns(m, n, "<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>\n", false, b);
    if (gen) sb_str(b, "<|start_of_role|>assistant<|end_of_role|>");
}

void chat_fmt_plain(const struct chat_template *t, const struct chat_msg *m, const enum role *r,
                    size_t n, bool gen, struct sb *b)
{
    switch (t->kind) {
    case CHAT_CHATML:
        fmt_chatml(t, m, r, n, gen, b);
        break;
    case CHAT_LLAMA3:
        fmt_llama3(m, n, gen, b);
        break;
    case CHAT_LLAMA2:
        if (t->variant == CHAT_VARIANT_MISTRAL_V7)
            fmt_mistral_v7(m, r, n, b);
        else if (t->variant >= CHAT_VARIANT_MISTRAL_V1)
            fmt_mistral(t->variant, m, r, n, b);
        else
            fmt_llama2(t->variant, m, r, n, b);
        break;
    case CHAT_DEEPSEEK3:
        fmt_deepseek3(t, m, r, n, NULL, gen, b, NULL);
        break;
    case CHAT_ZEPHYR:
        fmt_zephyr(m, n, gen, b);
        break;
    case CHAT_PHI3:
        fmt_phi3(t, m, r, n, gen, b);
        break;
    case CHAT_GEMMA:
        fmt_gemma(t, m, r, n, gen, b);
        break;
    case CHAT_GRANITE:
        fmt_granite(m, n, gen, b);
        break;
    }
}

/* gen as the formats take it */
static enum chat_end end_of(bool add_generation_prompt)
{
    return add_generation_prompt ? CHAT_END_GENERATE : CHAT_END_CLOSED;
}

int chat_format_tools(const struct chat_template *t, const struct chat_msg *msgs, size_t n,
                      const char *tools, enum chat_end end, char **out,
                      struct tokenizer_span **content, size_t *n_content, struct qerr *err)
{
    *out = NULL;
    if (content) *content = NULL;
    if (n_content) *n_content = 0;
    enum role *r = malloc((n ? n : 1) * sizeof *r);
    if (!r) return qerr_set(err, QERR_NOMEM, "chat_format: out of memory");
    bool tool_turns = false;
    for (size_t i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        bool calls = msgs[i].n_calls > 0 && role && !strcmp(role, "assistant");
        if (!role || (!msgs[i].content && !calls)) {
            free(r);
            return qerr_set(err, QERR_INVALID, "chat_format: message %zu has no %s", i,
                            role ? "content" : "role");
        }
        if (strcmp(role, "system") == 0) {
            r[i] = ROLE_SYSTEM;
        } else if (strcmp(role, "user") == 0) {
            r[i] = ROLE_USER;
        } else if (strcmp(role, "assistant") == 0) {
            r[i] = ROLE_ASSISTANT;
        } else if (strcmp(role, "tool") == 0) {
            r[i] = ROLE_TOOL;
        } else {
            free(r);
            return qerr_set(err, QERR_INVALID,
                            "chat_format: message %zu has unknown role \"%.40s\" (want system, "
                            "user, assistant or tool)",
                            i, role);
        }
        tool_turns |= calls || r[i] == ROLE_TOOL;
    }
    if (end == CHAT_END_CONTINUE &&
        (n == 0 || r[n - 1] != ROLE_ASSISTANT || !msgs[n - 1].content || msgs[n - 1].n_calls > 0)) {
        free(r);
        return qerr_set(err, QERR_INVALID,
                        "chat_format: continue_final_message needs the last message to be the "
                        "assistant's text (message %zu is %s)",
                        n ? n - 1 : 0, n == 0 ? "missing" : msgs[n - 1].role);
    }
    bool gen = end == CHAT_END_GENERATE || end == CHAT_END_GENERATE_NO_THINK;
    cJSON *list = NULL;
    if (tools) {
        list = cJSON_Parse(tools);
        if (!cJSON_IsArray(list)) {
            cJSON_Delete(list);
            free(r);
            return qerr_set(err, QERR_INVALID, "chat_format: the tool list is not a JSON list");
        }
    }
    struct sb b = {.spans = content && n_content};
    sb_put(&b, "", 0);
    int rc = 0;
    if (t->kind == CHAT_DEEPSEEK3)
        rc = fmt_deepseek3(t, msgs, r, n, list, gen, &b, err);
    else if (list || tool_turns)
        rc = chat_fmt_tools(t, msgs, r, n, list, gen, &b, err);
    else
        chat_fmt_plain(t, msgs, r, n, gen, &b);
    if (!rc && end == CHAT_END_GENERATE_NO_THINK && t->think_model)
        sb_str(&b, "<think>\n\n</think>\n\n");
    if (!rc && !b.oom && end == CHAT_END_CONTINUE) {
        /* the last content written is the last message's: what follows it closes the turn */
        b.n = b.content_end;
        b.p[b.n] = '\0';
        while (b.n_span > 0 && b.span[b.n_span - 1].off >= b.n) b.n_span--;
    }
    cJSON_Delete(list);
    free(r);
    if (!rc && b.oom) rc = qerr_set(err, QERR_NOMEM, "chat_format: out of memory");
    if (rc) {
        free(b.p);
        free(b.span);
        return rc;
    }
    *out = b.p;
    if (b.spans) {
        *content = b.span;
        *n_content = b.n_span;
    }
    return 0;
}

int chat_format_spans(const struct chat_template *t, const struct chat_msg *msgs, size_t n,
                      bool add_generation_prompt, char **out, struct tokenizer_span **content,
                      size_t *n_content, struct qerr *err)
{
    return chat_format_tools(t, msgs, n, NULL, end_of(add_generation_prompt), out, content,
                             n_content, err);
}

int chat_format(const struct chat_template *t, const struct chat_msg *msgs, size_t n,
                bool add_generation_prompt, char **out, struct qerr *err)
{
    return chat_format_tools(t, msgs, n, NULL, end_of(add_generation_prompt), out, NULL, NULL, err);
}

int chat_encode_tools(const struct chat_template *t, const struct tokenizer *tok,
                      const struct chat_msg *msgs, size_t n, const char *tools, enum chat_end end,
                      bool add_bos, bool content_special, int32_t **ids, size_t *n_ids,
                      struct qerr *err)
{
    *ids = NULL;
    *n_ids = 0;
    char *text;
    struct tokenizer_span *content;
    size_t n_content;
    int rc = chat_format_tools(t, msgs, n, tools, end, &text, &content, &n_content, err);
    if (rc) return rc;
    if (content_special) n_content = 0; /* the whole text may name control tokens */
    rc = tokenizer_encode_spans(tok, text, strlen(text), add_bos, content, n_content, ids, n_ids,
                                err);
    free(content);
    free(text);
    return rc;
}

int chat_encode(const struct chat_template *t, const struct tokenizer *tok,
                const struct chat_msg *msgs, size_t n, bool add_generation_prompt, bool add_bos,
                bool content_special, int32_t **ids, size_t *n_ids, struct qerr *err)
{
    return chat_encode_tools(t, tok, msgs, n, NULL, end_of(add_generation_prompt), add_bos,
                             content_special, ids, n_ids, err);
}
