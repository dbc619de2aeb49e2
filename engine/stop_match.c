/* stop_match: stop strings in held-back text (stop_match.h). */
#include "stop_match.h"

#include <string.h>

int stop_find(const char *text, int n, char *const *stops, int n_stops)
{
    int best = -1;
    if (n <= 0) return best; /* nothing held yet: text may be NULL, which memmem may not take */
    for (int k = 0; k < n_stops; k++) {
        const char *hit = memmem(text, (size_t)n, stops[k], strlen(stops[k]));
        if (hit && (best < 0 || hit - text < best)) best = (int)(hit - text);
    }
    return best;
}

int stop_partial_suffix(const char *text, int n, char *const *stops, int n_stops)
{
    int best = 0;
    if (n <= 0) return best;
    for (int k = 0; k < n_stops; k++) {
        int len = (int)strlen(stops[k]);
        for (int l = len - 1 > n ? n : len - 1; l > best; l--)
            if (memcmp(text + n - l, stops[k], (size_t)l) == 0) {
                best = l;
                break;
            }
    }
    return best;
}
