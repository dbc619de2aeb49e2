/* chat_impl: what chat.c and chat_tools.c share (not part of chat.h's contract): the growing
 * text buffer that records where message content lands, and the plain formatter. */
#ifndef QUERN_CHAT_IMPL_H
#define QUERN_CHAT_IMPL_H

#include "chat.h"

struct sb {
    char *p;
    size_t n, cap;
    bool oom;
    size_t content_end; /* where the latest message content written ends (empty content too) */
    /* where message content was written; collected only when spans is set */
    bool spans;
    struct tokenizer_span *span;
    size_t n_span, cap_span;
};

void sb_put(struct sb *b, const char *s, size_t n);
void sb_str(struct sb *b, const char *s); /* the template's own text */
/* Message content n bytes long (its range is recorded: control tokens never match in it). */
void sb_content(struct sb *b, const char *s, size_t n);
void sb_msg(struct sb *b, const char *s);     /* sb_content of a NUL-terminated string */
void sb_trimmed(struct sb *b, const char *s); /* ... with ASCII whitespace trimmed off */
bool chat_is_space(char c);

enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL };

/* The template's plain format of messages whose roles r are system, user or assistant. */
void chat_fmt_plain(const struct chat_template *t, const struct chat_msg *m, const enum role *r,
                    size_t n, bool gen, struct sb *b);

/* An assistant message's text and reasoning as Qwen3's template takes them apart: its
 * reasoning_content and whole text when it has one, else the text after the last "</think>"
 * (newlines before it off) and the reasoning inside the first block (newlines around it off);
 * no block: all text, empty reasoning. Pointers into m's strings. */
struct chat_think {
    const char *text, *reasoning;
    size_t text_len, reasoning_len;
};
void chat_split_think(const struct chat_msg *m, struct chat_think *out);

/* chat_tools.c: formats a conversation that offers tools (tools: the parsed list, NULL when
 * none is offered) or holds tool calls or results; QERR_INVALID names a malformed piece. */
struct cJSON;
int chat_fmt_tools(const struct chat_template *t, const struct chat_msg *m, const enum role *r,
                   size_t n, const struct cJSON *tools, bool gen, struct sb *b, struct qerr *err);

#endif
