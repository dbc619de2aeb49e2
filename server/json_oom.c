/* cJSON allocation failures, per thread (json_oom.h). The flag is thread-local: each HTTP
 * thread builds its own documents, and one thread's failure says nothing of another's. */
#include "json_oom.h"

#include <stdlib.h>

static _Thread_local bool failed;

static void *json_malloc(size_t n)
{
    void *p = malloc(n);
    if (!p) failed = true;
    return p;
}

void json_oom_install(void)
{
    cJSON_InitHooks(&(cJSON_Hooks){.malloc_fn = json_malloc, .free_fn = free});
}

bool json_oom_take(void)
{
    bool f = failed;
    failed = false;
    return f;
}

bool json_add(cJSON *o, const char *key, cJSON *item)
{
    if (cJSON_AddItemToObject(o, key, item)) return true;
    cJSON_Delete(item);
    return false;
}

char *json_print_free(cJSON *o)
{
    if (!o) {
        json_oom_take();
        return NULL;
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (json_oom_take()) {
        free(s);
        return NULL;
    }
    return s;
}
