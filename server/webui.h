/* webui: the built-in web page (GET /: a chat playground and a live view of the engine). Its
 * files (server/webui/) are compiled into the binary by a meson custom target
 * (server/webui/embed.py writes the table below), so the daemon serves them with no files on
 * disk and the page loads nothing from the network. `quern serve --no-webui` turns it off. */
#ifndef QUERN_WEBUI_H
#define QUERN_WEBUI_H

#include <stddef.h>

struct webui_file {
    const char *path;          /* "/" (index.html) or "/webui/NAME" */
    const char *content_type;  /* with its charset */
    const unsigned char *data; /* NUL-terminated after len bytes */
    size_t len;
};

extern const struct webui_file webui_files[];
extern const int webui_n_files;

#endif
