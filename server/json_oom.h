/* json_oom: cJSON's allocation failures, noticed (issue 20's fault-injection sweep).
 *
 * cJSON's builders return NULL when out of memory, and cJSON_Add*(obj, key, NULL) quietly adds
 * nothing, so a document built under memory pressure could come out well-formed but missing
 * fields: a 200 whose message has no content. Every cJSON allocation goes through a hook that
 * records a failure for the calling thread; json_print_free then refuses such a document, and
 * the writers' callers already turn its NULL into a 500. */
#ifndef QUERN_JSON_OOM_H
#define QUERN_JSON_OOM_H

#include <cjson/cJSON.h>
#include <stdbool.h>

/* Routes cJSON's allocations through the hook; once, before any thread (main). */
void json_oom_install(void);
/* Whether a cJSON allocation failed on this thread since the last call; clears it. */
bool json_oom_take(void);
/* cJSON_AddItemToObject that deletes item when it cannot be added (the key's copy failed),
 * rather than leak it; false then. */
bool json_add(cJSON *o, const char *key, cJSON *item);
/* Prints o and deletes it: NULL when o is NULL, printing failed, or a cJSON allocation on this
 * thread failed since the last json_oom_take (the document may lack parts). */
char *json_print_free(cJSON *o);

#endif
