/* mapfile.h: a whole file, read-only, memory-mapped when possible.
 *
 * mmap(PROT_READ, MAP_PRIVATE) on POSIX; when mmap is not possible (a pipe, a
 * file system without mmap, a zero-length file) the file is read into a heap
 * buffer instead, so callers never need to care. Internal header (src/).
 * Non-goals: writing, growing files, Windows.
 *
 *   kn_mapfile *m;
 *   if (kn_mapfile_open("model.gguf", &m) != KN_OK) return fail(kn_last_error());
 *   use(m->data, m->size);
 *   kn_mapfile_close(m);                    // NULL is a no-op
 */
#ifndef KN_MAPFILE_H
#define KN_MAPFILE_H
#include "kiln_base.h"

typedef struct kn_mapfile {
    const void *data;   /* size bytes, page-aligned when mapped (never NULL on success) */
    size_t size;        /* file size in bytes                                           */
    bool mapped;        /* true: mmap; false: heap copy                                 */
} kn_mapfile;

/* Open `path` read-only. On failure returns KN_ERR_IO (or KN_ERR_NOMEM) with a
 * message naming the path and the OS error; *out = NULL. */
kn_status kn_mapfile_open(const char *path, kn_mapfile **out);
void kn_mapfile_close(kn_mapfile *m);   /* NULL is a no-op */
/* For readers that parse a mapped file: after a failed parse, close the
 * mapping and return s with the file's path put in front of the parser's
 * message ("model.gguf: tensor 'x' ..."). */
kn_status kn_mapfile_fail(kn_mapfile *m, const char *path, kn_status s);
#endif
