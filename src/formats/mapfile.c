/* mapfile.c: read-only file mapping with a read() fallback (see mapfile.h). */
#include "formats/mapfile.h"
#include <stdio.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Read the whole stream into a heap buffer (for files mmap refuses). */
static kn_status read_all(int fd, const char *path, size_t hint, void **buf_out, size_t *size_out) {
    size_t cap = hint ? hint + 1 : 65536, size = 0;
    unsigned char *buf = malloc(cap);
    if (!buf) return kn_set_error(KN_ERR_NOMEM, "%s: cannot allocate %zu bytes to read the file", path, cap);
    for (;;) {
        if (size == cap) {
            if (cap > SIZE_MAX / 2) { free(buf); return kn_set_error(KN_ERR_NOMEM, "%s: file too large", path); }
            unsigned char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); return kn_set_error(KN_ERR_NOMEM, "%s: out of memory reading the file", path); }
            buf = nb; cap *= 2;
        }
        ssize_t r = read(fd, buf + size, cap - size);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            free(buf);
            return kn_set_error(KN_ERR_IO, "%s: read failed: %s", path, strerror(e));
        }
        if (r == 0) break;
        size += (size_t)r;
    }
    *buf_out = buf; *size_out = size;
    return KN_OK;
}

/* "a directory", "a FIFO (named pipe)", ...: what a non-regular file is */
static const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

kn_status kn_open_regular(const char *path, const char *what, int *fd_out, uint64_t *size_out) {
    *fd_out = -1;
    *size_out = 0;
    if (!what) what = "file";
    if (!path) return kn_set_error(KN_ERR_INVALID, "no %s path given", what);
    /* O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer,
     * forever if none comes; a regular file ignores the flag */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        const char *hint = e == ENOENT ? "; check the path" : e == EACCES ? "; check the file's permissions" : "";
        kn_set_error(KN_ERR_IO, "cannot open %s '%s': %s%s", what, path, strerror(e), hint);
        errno = e;
        return KN_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        kn_set_error(KN_ERR_IO, "cannot stat %s '%s': %s", what, path, strerror(e));
        errno = e;
        return KN_ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        kn_set_error(KN_ERR_IO, "%s '%s' is %s; give the path of a regular file", what, path, file_kind(st.st_mode));
        errno = 0;
        return KN_ERR_IO;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    *size_out = st.st_size > 0 ? (uint64_t)st.st_size : 0;
    return KN_OK;
}

kn_status kn_mapfile_open(const char *path, kn_mapfile **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_mapfile_open: out is NULL");
    *out = NULL;
    if (!path) return kn_set_error(KN_ERR_INVALID, "kn_mapfile_open: path is NULL");
    int fd;
    uint64_t fsize;
    kn_status os = kn_open_regular(path, NULL, &fd, &fsize);
    if (os != KN_OK) return os;
    kn_mapfile *m = calloc(1, sizeof *m);
    if (!m) { close(fd); return kn_set_error(KN_ERR_NOMEM, "out of memory opening '%s'", path); }
    if (fsize > 0 && fsize <= SIZE_MAX) {
        void *p = mmap(NULL, (size_t)fsize, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p != MAP_FAILED) {
            m->data = p; m->size = (size_t)fsize; m->mapped = true;
            close(fd);
            *out = m;
            return KN_OK;
        }
    }
    void *buf = NULL; size_t size = 0;
    size_t hint = fsize <= SIZE_MAX / 2 ? (size_t)fsize : 0;
    kn_status s = read_all(fd, path, hint, &buf, &size);
    close(fd);
    if (s != KN_OK) { free(m); return s; }
    m->data = buf; m->size = size; m->mapped = false;
    *out = m;
    return KN_OK;
}

void kn_mapfile_close(kn_mapfile *m) {
    if (!m) return;
    if (m->mapped) munmap((void *)m->data, m->size);
    else free((void *)m->data);
    free(m);
}

kn_status kn_mapfile_fail(kn_mapfile *m, const char *path, kn_status s) {
    char msg[900];
    snprintf(msg, sizeof msg, "%s", kn_last_error());
    kn_mapfile_close(m);
    return kn_set_error(s, "%s: %s", path, msg);
}
