/* mapfile.h: a whole file, read-only, memory-mapped when possible.
 *
 * mmap(PROT_READ, MAP_PRIVATE) on POSIX; when mmap is not possible (a file
 * system without mmap, a zero-length file) the file is read into a heap
 * buffer instead, so callers never need to care. Only regular files are
 * opened (kn_open_regular): a FIFO without a writer would block open()
 * forever, and a directory or device is never what the caller meant.
 * Internal header (src/). Non-goals: writing, growing files, Windows.
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

/* Open `path` read-only as a regular file, never blocking: the open is
 * non-blocking, and a directory, FIFO, device or socket is refused. `what`
 * names the file in messages ("model file"; NULL: "file"). On success
 * *fd_out is a blocking descriptor (the caller closes it) and *size_out the
 * file's size. On failure KN_ERR_IO with a message naming the path and the
 * system's reason ("No such file or directory", "Permission denied"), and
 * errno tells that reason (0 for a file of the wrong type). */
kn_status kn_open_regular(const char *path, const char *what, int *fd_out, uint64_t *size_out);

/* Open `path` read-only (a regular file, see kn_open_regular). On failure
 * returns KN_ERR_IO (or KN_ERR_NOMEM) with a message naming the path and the
 * OS error; *out = NULL. */
kn_status kn_mapfile_open(const char *path, kn_mapfile **out);
void kn_mapfile_close(kn_mapfile *m);   /* NULL is a no-op */
/* For readers that parse a mapped file: after a failed parse, close the
 * mapping and return s with the file's path put in front of the parser's
 * message ("model.gguf: tensor 'x' ..."). */
kn_status kn_mapfile_fail(kn_mapfile *m, const char *path, kn_status s);
#endif
